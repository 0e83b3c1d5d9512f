# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Request records as columns: what the metrics read of each record, a few numbers a request.

A simulated run's records hold every token time (~1 KB a request); the metrics need fifteen
numbers of each (77 B). ``RecordColumns.of`` computes them for a batch of records at once (the
per-token deadline check vectorised over all their token times), and ``RecordFold`` keeps the
columns of records folded in while a run goes, so that a long run can drop each finished
record (``hfx sim --fold-records``). Concatenated in the order the records were opened, the
columns give the metrics exactly what the records would have (hfx/records/metrics.py).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import cast

import numpy as np

from hfx.request import Outcome, RequestRecord

_EMPTY = np.zeros(0)
OUTCOMES = tuple(Outcome)
_CODE = {o: i for i, o in enumerate(OUTCOMES)}  # an outcome's code in the outcome column
NO_PRIORITY = -1


@dataclass(slots=True)
class RecordColumns:
    """One entry per record, in the order given."""

    seq: np.ndarray  # RequestRecord.seq: the order the ledger opened them in
    outcome: np.ndarray  # index into OUTCOMES
    finished: np.ndarray
    ttft: np.ndarray  # NaN where the record has no token
    tpot: np.ndarray
    e2e: np.ndarray
    tokens: np.ndarray
    met: np.ndarray  # HyperFlexis Eq. 4
    met_dslo: np.ndarray  # PolyServe §2.3's per-token deadlines
    best_effort: np.ndarray
    arrival: np.ndarray
    first: np.ndarray  # first token time, NaN if none
    finish: np.ndarray  # NaN while pending
    task: np.ndarray  # index into the task names of the fold (or of ``of``'s ``tasks``)
    priority: np.ndarray  # NO_PRIORITY if none
    prompt: np.ndarray  # prompt tokens
    cached: np.ndarray  # of them, found in the prefix cache (RequestRecord.cached_tokens)

    @classmethod
    def of(cls, records: Iterable[RequestRecord], tasks: dict[str, int]) -> RecordColumns:
        """Columns of ``records``; task names are numbered in ``tasks`` (extended in place)."""
        rows = RecordRows(tasks)
        for r in records:
            rows.add(r)
        return rows.take()

    def __len__(self) -> int:
        return len(self.seq)

    def keep(self, idx: np.ndarray) -> None:
        """Only the entries at ``idx``, a column at a time (a 27 M-request run's columns are
        ~2 GB)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name)[idx])


# The columns ``RecordColumns.of`` fills row by row, in the order of its rows, and their types
# (``met_dslo`` is computed after, over a batch).
_ROW = (("seq", np.int64), ("outcome", np.int8), ("finished", bool), ("ttft", float),
        ("tpot", float), ("e2e", float), ("tokens", np.int64), ("met", bool),
        ("best_effort", bool), ("arrival", float), ("first", float), ("finish", float),
        ("task", np.int32), ("priority", np.int32), ("prompt", np.int64), ("cached", np.int64))


class RecordRows:
    """``RecordColumns`` made a row at a time: ``add`` takes what the columns need of a record,
    ``take`` makes the columns of every row added since the last ``take``. A run adds each
    finished record as it ends, while its objects are still in cache: taken 4,096 records at a
    time later, the same rows cost ~2.3× as much (docs/performance.md, "Compiled")."""

    # A row of Python numbers a record, made into arrays a column at a time: a numpy element
    # store costs ~0.1 µs, fifteen a record.
    _rows: list[tuple[int | float | bool, ...]]
    # The deadline check's inputs, over the finished records with a target: their token times
    # end to end, and per record its row, token count, first deadline and pace.
    _times: array
    _checked: list[int]
    _lengths: list[int]
    _base: list[float]
    _step: list[float]

    def __init__(self, tasks: dict[str, int]) -> None:
        self.tasks = tasks  # task name → its code, extended in place
        self._clear()

    def _clear(self) -> None:
        self._rows, self._times = [], array("d")
        self._checked, self._lengths, self._base, self._step = [], [], [], []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, r: RequestRecord) -> None:
        req = r.request
        t = r.times()
        k = len(t)
        done = r.outcome is Outcome.FINISHED
        e2e = ttft = tpot = 0.0
        met = False
        if done:
            e2e = cast(float, r.finish_time) - req.arrival
            if not k:  # finished with no token (a stream that ended at once): no latencies
                ttft = tpot = math.nan
            else:
                ttft = t[0] - req.arrival
                tpot = 0.0 if k == 1 else (t[-1] - t[0]) / (k - 1)  # RequestRecord.tpot
                target = r.target
                if target is not None:
                    met = ttft <= target.ttft and tpot <= target.tpot  # HyperFlexis Eq. 4
                    self._times += t
                    self._checked.append(len(self._rows))
                    self._lengths.append(k)
                    self._base.append(req.arrival + target.ttft)
                    self._step.append(target.tpot)
        self._rows.append((r.seq, _CODE[r.outcome], done, ttft, tpot, e2e, k if done else 0,
                           met, r.best_effort, req.arrival, t[0] if k else math.nan,
                           math.nan if r.finish_time is None else r.finish_time,
                           self.tasks.setdefault(req.task, len(self.tasks)),
                           NO_PRIORITY if req.priority is None else req.priority,
                           req.prompt_len, r.cached_tokens))

    def take(self) -> RecordColumns:
        """The columns of the rows added since the last ``take``, in the order added."""
        rows = self._rows
        values = list(zip(*rows, strict=True)) if rows else [()] * len(_ROW)
        cols = RecordColumns(**{name: np.array(column, dtype=dtype)
                                for (name, dtype), column in zip(_ROW, values, strict=True)},
                             met_dslo=np.zeros(len(rows), dtype=bool))
        if self._checked:
            # PolyServe §2.3: token j by arrival + TTFT + j·TPOT (RequestRecord's own check,
            # the same operations in the same order).
            lengths = np.asarray(self._lengths, dtype=np.int64)
            starts = np.zeros(len(lengths), dtype=np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            j = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
            deadlines = np.repeat(np.asarray(self._base), lengths) + \
                np.repeat(np.asarray(self._step), lengths) * j
            ok = np.frombuffer(self._times, dtype=np.float64) <= deadlines
            cols.met_dslo[np.asarray(self._checked)] = np.logical_and.reduceat(ok, starts)
        self._clear()
        return cols


def count_outcome(outcomes: np.ndarray, outcome: Outcome) -> int:
    """How many entries of an ``outcome`` column are ``outcome``."""
    return int(np.count_nonzero(outcomes == _CODE[outcome]))


class RecordFold:
    """Columns of records folded in as they end; ``columns`` adds the records still kept and
    puts every entry in the order the ledger opened them, as ``RecordColumns.of`` would have
    taken them from the ledger at the end."""

    def __init__(self) -> None:
        self.tasks: dict[str, int] = {}
        self.rows = RecordRows(self.tasks)  # records added one at a time, not yet folded
        self._parts: list[RecordColumns] = []
        self.num_folded = 0

    def fold_rows(self) -> None:
        """Fold in the records added to ``rows``."""
        n = len(self.rows)
        if n:
            self._parts.append(self.rows.take())
            self.num_folded += n

    def columns(self, kept: Sequence[RequestRecord] = ()) -> RecordColumns:
        """Every record folded in and ``kept``, in opening order. Once: the folded parts are
        released a column at a time as the whole is built."""
        parts = [*self._parts, RecordColumns.of(kept, self.tasks)]
        self._parts = []
        seq = np.concatenate([p.seq for p in parts])
        order = np.argsort(seq, kind="stable")
        out: dict[str, np.ndarray] = {"seq": seq[order]}
        del seq
        for f in fields(RecordColumns):
            if f.name == "seq":
                continue
            out[f.name] = np.concatenate([getattr(p, f.name) for p in parts])[order]
            for p in parts:
                setattr(p, f.name, _EMPTY)
        return RecordColumns(**out)

    def task_names(self) -> list[str]:
        return list(self.tasks)


# Finished records folded into columns at once: the per-token deadline check is vectorised over
# a batch's token times. 512 records of ~300 tokens keep each of its arrays (~1.2 MB) in a
# core's L2; at 4,096 they spill, and a record's add and fold cost ~5 µs, not ~3 (scratch,
# four-task records; docs/performance.md).
FOLD_BATCH = 512


class FoldFinished:
    """A ledger's ``on_done`` for a run that needs only its metrics: each finished record goes
    into ``rows`` and out of the ledger (``forget``) as it ends, while its objects are in
    cache; the rows are folded (``fold_rows``) ``batch`` at a time. Only finished ones: a
    rejected, shed or aborted record may still be looked up when its instance reports the end
    (they are few, and kept). Compiled with this module: it runs once a request."""

    def __init__(self, rows: RecordRows, fold_rows: Callable[[], None],
                 forget: Callable[[str], object], batch: int = FOLD_BATCH) -> None:
        self.rows = rows
        self._fold_rows = fold_rows
        self._forget = forget
        self._batch = batch
        self.folds = 0  # batches folded while the run went on

    def __call__(self, record: RequestRecord) -> None:
        if record.outcome is Outcome.FINISHED:
            rows = self.rows
            rows.add(record)
            self._forget(record.request.id)
            if len(rows) >= self._batch:
                self.folds += 1
                self._fold_rows()

    def flush(self) -> None:
        """At the run's end: fold the rows of the last batch."""
        self._fold_rows()
