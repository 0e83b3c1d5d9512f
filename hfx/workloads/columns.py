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
        # Python lists, made arrays once: a numpy element store costs ~0.1 µs, ~15 a record.
        nan = math.nan
        seq: list[int] = []
        outcome: list[int] = []
        finished: list[bool] = []
        ttft: list[float] = []
        tpot: list[float] = []
        e2e: list[float] = []
        tokens: list[int] = []
        met: list[bool] = []
        best_effort: list[bool] = []
        arrival: list[float] = []
        first: list[float] = []
        finish: list[float] = []
        task: list[int] = []
        priority: list[int] = []
        # The deadline check's inputs, over the finished records with a target.
        times: list[np.ndarray] = []
        checked: list[int] = []
        base: list[float] = []
        step: list[float] = []
        for i, r in enumerate(records):
            req = r.request
            seq.append(r.seq)
            outcome.append(_CODE[r.outcome])
            best_effort.append(r.best_effort)
            arrival.append(req.arrival)
            task.append(tasks.setdefault(req.task, len(tasks)))
            priority.append(NO_PRIORITY if req.priority is None else req.priority)
            finish.append(nan if r.finish_time is None else r.finish_time)
            t = r.times()
            k = len(t)
            first.append(t[0] if k else nan)
            if r.outcome is not Outcome.FINISHED:
                finished.append(False)
                e2e.append(0.0)
                ttft.append(0.0)
                tpot.append(0.0)
                tokens.append(0)
                met.append(False)
                continue
            finished.append(True)
            e2e.append(cast(float, r.finish_time) - req.arrival)
            if not k:  # finished with no token (a stream that ended at once): no latencies
                ttft.append(nan)
                tpot.append(nan)
                tokens.append(0)
                met.append(False)
                continue
            t0, t1 = t[0], t[-1]
            ttft_i = t0 - req.arrival
            tpot_i = 0.0 if k == 1 else (t1 - t0) / (k - 1)  # RequestRecord.tpot
            ttft.append(ttft_i)
            tpot.append(tpot_i)
            tokens.append(k)
            target = r.target
            if target is None:
                met.append(False)
                continue
            met.append(ttft_i <= target.ttft and tpot_i <= target.tpot)  # HyperFlexis Eq. 4
            times.append(np.frombuffer(t, dtype=np.float64))
            checked.append(i)
            base.append(req.arrival + target.ttft)
            step.append(target.tpot)
        n = len(seq)
        cols = cls(seq=np.array(seq, dtype=np.int64), outcome=np.array(outcome, dtype=np.int8),
                   finished=np.array(finished, dtype=bool), ttft=np.array(ttft, dtype=float),
                   tpot=np.array(tpot, dtype=float), e2e=np.array(e2e, dtype=float),
                   tokens=np.array(tokens, dtype=np.int64), met=np.array(met, dtype=bool),
                   met_dslo=np.zeros(n, dtype=bool),
                   best_effort=np.array(best_effort, dtype=bool),
                   arrival=np.array(arrival, dtype=float), first=np.array(first, dtype=float),
                   finish=np.array(finish, dtype=float), task=np.array(task, dtype=np.int32),
                   priority=np.array(priority, dtype=np.int32))
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
