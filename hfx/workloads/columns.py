"""Request records as columns: what the metrics read of each record, a few numbers a request.

A simulated run's records hold every token time (~1 KB a request); the metrics need fifteen
numbers of each (77 B). ``RecordColumns.of`` computes them for a batch of records at once (the
per-token deadline check vectorised over all their token times), and ``RecordFold`` keeps the
columns of records folded in while a run goes, so that a long run can drop each finished
record (``hfx sim --fold-records``). Concatenated in the order the records were opened, the
columns give the metrics exactly what the records would have (hfx/workloads/metrics.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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

    @classmethod
    def of(cls, records: Sequence[RequestRecord], tasks: dict[str, int]) -> RecordColumns:
        """Columns of ``records``; task names are numbered in ``tasks`` (extended in place)."""
        # A row of Python numbers a record, made into arrays a column at a time: a numpy
        # element store costs ~0.1 µs, fifteen a record.
        rows: list[tuple[int | float | bool, ...]] = []
        # The deadline check's inputs, over the finished records with a target.
        times: list[np.ndarray] = []
        checked: list[int] = []
        base: list[float] = []
        step: list[float] = []
        for i, r in enumerate(records):
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
                        times.append(np.frombuffer(t, dtype=np.float64))
                        checked.append(i)
                        base.append(req.arrival + target.ttft)
                        step.append(target.tpot)
            rows.append((r.seq, _CODE[r.outcome], done, ttft, tpot, e2e, k if done else 0, met,
                         r.best_effort, req.arrival, t[0] if k else math.nan,
                         math.nan if r.finish_time is None else r.finish_time,
                         tasks.setdefault(req.task, len(tasks)),
                         NO_PRIORITY if req.priority is None else req.priority))
        values = list(zip(*rows, strict=True)) if rows else [()] * len(_ROW)
        cols = cls(**{name: np.array(column, dtype=dtype)
                      for (name, dtype), column in zip(_ROW, values, strict=True)},
                   met_dslo=np.zeros(len(rows), dtype=bool))
        if checked:
            # PolyServe §2.3: token j by arrival + TTFT + j·TPOT (RequestRecord's own check,
            # the same operations in the same order).
            lengths = np.fromiter((len(t) for t in times), dtype=np.int64, count=len(times))
            starts = np.zeros(len(times), dtype=np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            j = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
            deadlines = np.repeat(np.asarray(base), lengths) + \
                np.repeat(np.asarray(step), lengths) * j
            ok = np.concatenate(times) <= deadlines
            cols.met_dslo[np.asarray(checked)] = np.logical_and.reduceat(ok, starts)
        return cols

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
        ("task", np.int32), ("priority", np.int32))


def count_outcome(outcomes: np.ndarray, outcome: Outcome) -> int:
    """How many entries of an ``outcome`` column are ``outcome``."""
    return int(np.count_nonzero(outcomes == _CODE[outcome]))


class RecordFold:
    """Columns of records folded in as they end; ``columns`` adds the records still kept and
    puts every entry in the order the ledger opened them, as ``RecordColumns.of`` would have
    taken them from the ledger at the end."""

    def __init__(self) -> None:
        self.tasks: dict[str, int] = {}
        self._parts: list[RecordColumns] = []
        self.num_folded = 0

    def add(self, records: Sequence[RequestRecord]) -> None:
        if records:
            self._parts.append(RecordColumns.of(records, self.tasks))
            self.num_folded += len(records)

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
