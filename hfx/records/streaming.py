"""A run's metrics in bounded memory: records folded into counters, sums and latency sketches as
they end (``hfx sim --metrics streaming``).

``RecordFold`` (columns.py) keeps fifteen numbers a request, exact and ~77 B each: 2 GB for the
27 M requests of 1,000 instances over ten minutes, 16 GB for an hour. ``StreamingFold`` keeps,
per group (all requests, each task, each priority), the outcome counts, the Eq. 4 and
per-token-deadline hits, and a ``LatencySketch`` each of TTFT, TPOT and E2E: memory that does
not grow with the run. What differs from the exact metrics (hfx/records/metrics.py):

- percentiles are within ``sketch.ALPHA`` (0.5%) of the exact ones, relatively (DDSketch);
- means are sums over the batches folded, so they may differ in the last bits;
- counts, attainment, goodput, throughput, the window and the backlog are exact.

The warm-up is cut as records are folded (by arrival, as the exact path cuts them at the end).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from hfx.records.columns import NO_PRIORITY, RecordColumns, RecordRows, count_outcome
from hfx.records.metrics import cost_units, group_counts, group_keys, longest_wait
from hfx.records.sketch import LatencySketch
from hfx.request import Outcome, RequestRecord


class _Group:
    """What ``metrics._group`` reports of one group, accumulated."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(("requests", "finished", "rejected", "failed", "shed",
                                     "best_effort", "met", "met_dslo", "prompt_tokens",
                                     "cached_tokens"), 0)
        self.ttft, self.tpot, self.e2e = LatencySketch(), LatencySketch(), LatencySketch()

    def add(self, cols: RecordColumns, idx: np.ndarray | None = None) -> None:
        for key, n in group_counts(cols, idx).items():
            self.counts[key] += n
        done = cols.finished if idx is None else idx[cols.finished[idx]]
        self.ttft.add(cols.ttft[done])
        self.tpot.add(cols.tpot[done])
        self.e2e.add(cols.e2e[done])

    def summary(self) -> dict:
        return group_keys(self.counts, _distribution(self.ttft), _distribution(self.tpot),
                          _distribution(self.e2e))


def _distribution(sketch: LatencySketch) -> dict[str, float | None]:
    if not sketch.count:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": sketch.mean(), "p50": sketch.percentile(50),
            "p90": sketch.percentile(90), "p99": sketch.percentile(99)}


class StreamingFold:
    """``RecordFold``'s role (``add`` as records end, then the rest at the end), keeping
    aggregates instead of columns. Records that arrived before ``warmup`` are not scored."""

    def __init__(self, warmup: float = 0.0) -> None:
        self.warmup = warmup
        self.tasks: dict[str, int] = {}
        self.rows = RecordRows(self.tasks)  # records added one at a time, not yet folded
        self.num_folded = 0
        self.backlog = 0  # requests still pending at the end, the warm-up's included
        self._all = _Group()
        self._by_task: dict[int, _Group] = {}
        self._by_priority: dict[int, _Group] = {}
        self._first_seq: dict[int, int] = {}  # task code → its first measured record's seq
        self._first_arrival = math.inf
        self._last_finish = -math.inf
        self._tokens = 0
        self._max_wait = 0.0
        self._measured = 0

    def add(self, records: Iterable[RequestRecord], end: float | None = None) -> None:
        """Fold ``records`` in. ``end``: the run has stopped there and these are the records
        left (a pending one's wait runs to ``end``)."""
        for r in records:
            self.rows.add(r)
        self.fold_rows(end)

    def fold_rows(self, end: float | None = None) -> None:
        """Fold in the records added to ``rows`` (``end``: as ``add``)."""
        n = len(self.rows)
        if not n:
            return
        cols = self.rows.take()
        self.num_folded += n
        self.backlog += count_outcome(cols.outcome, Outcome.PENDING)
        cols.keep(np.flatnonzero(cols.arrival >= self.warmup))
        if not len(cols):
            return
        self._measured += len(cols)
        self._all.add(cols)
        for code in np.unique(cols.task).tolist():
            idx = np.flatnonzero(cols.task == code)
            self._by_task.setdefault(code, _Group()).add(cols, idx)
            first = int(cols.seq[idx].min())
            self._first_seq[code] = min(self._first_seq.get(code, first), first)
        for level in np.unique(cols.priority[cols.priority != NO_PRIORITY]).tolist():
            self._by_priority.setdefault(level, _Group()).add(
                cols, np.flatnonzero(cols.priority == level))
        self._first_arrival = min(self._first_arrival, float(cols.arrival.min()))
        if cols.finished.any():
            self._last_finish = max(self._last_finish, float(cols.finish[cols.finished].max()))
        self._tokens += int(cols.tokens.sum())
        self._max_wait = max(self._max_wait,
                             longest_wait(cols, math.inf if end is None else end))

    def summary(self, spans: Iterable[tuple[float, float]]) -> dict:
        """``metrics.summarize_columns``'s keys, from the aggregates."""
        out = self._all.summary()
        span = 0.0
        if self._all.counts["finished"]:
            span = max(self._last_finish - self._first_arrival, 1e-9)
        out["goodput_rps"] = self._all.counts["met"] / span if span else 0.0
        out["throughput_rps"] = out["finished"] / span if span else 0.0
        out["output_tokens_per_s"] = self._tokens / span if span else 0.0
        out["cost_units"] = cost_units(spans)
        names = list(self.tasks)
        out["per_task"] = {names[code]: self._by_task[code].summary()
                           for code in sorted(self._by_task, key=self._first_seq.__getitem__)}
        if self._by_priority:
            out["per_priority"] = {str(p): self._by_priority[p].summary()
                                   for p in sorted(self._by_priority)}
        return out

    @property
    def max_wait(self) -> float:
        """The longest any measured request went without a first token."""
        return self._max_wait if self._measured else 0.0
