"""Metrics over request records (HyperFlexis §3 and §7.5).

- attainment: seed Eq. 4, the fraction of *all* requests that finished with TTFT and mean TPOT
  within their SLO (rejected, shed, failed and aborted requests count as misses);
- attainment_dslo: the deadline-based variant (PolyServe §2.3);
- ttft / tpot / e2e: mean and percentiles over finished requests, in seconds;
- goodput_rps: requests that met their SLO per second of the run; throughput_rps: finished
  requests per second; both over the span from the first arrival to the last finish;
- cost_units: seed Eq. 3 with the unit of §7.5, one instance active for 50 ms; an instance is
  active from the moment it is provisioned until it is released, rounded up to whole units.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np

from hfx.request import Outcome, RequestRecord

COST_UNIT_SECONDS = 0.05  # HyperFlexis §7.5


def cost_units(spans: Iterable[tuple[float, float]], unit: float = COST_UNIT_SECONDS) -> int:
    """Seed Eq. 3: Σ over instances of active time, in units of one instance for ``unit`` s."""
    total = 0
    for start, end in spans:
        if end < start:
            raise ValueError(f"instance released ({end}) before it was provisioned ({start})")
        # Rounding guards against 0.15/0.05 = 3.0000000000000004 becoming 4 units.
        total += math.ceil(round((end - start) / unit, 9))
    return total


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


class _Columns:
    """Each record's outcome and latencies as arrays, computed once for a run's metrics:
    one pass over the records, the per-token deadline check over all token times at once
    (a simulated run's records hold ~10⁵–10⁷ of them)."""

    def __init__(self, records: Sequence[RequestRecord]) -> None:
        n = len(records)
        self.finished = np.zeros(n, dtype=bool)
        self.ttft = np.zeros(n)
        self.tpot = np.zeros(n)
        self.e2e = np.zeros(n)
        self.tokens = np.zeros(n, dtype=np.int64)
        self.met = np.zeros(n, dtype=bool)
        self.met_dslo = np.zeros(n, dtype=bool)
        # The deadline check's inputs, over the finished records with a target.
        times: list[np.ndarray] = []
        checked: list[int] = []
        base: list[float] = []
        step: list[float] = []
        for i, r in enumerate(records):
            if r.outcome is not Outcome.FINISHED:
                continue
            t = r.times()
            k = len(t)
            self.finished[i] = True
            self.e2e[i] = cast(float, r.finish_time) - r.request.arrival
            if not k:  # finished with no token (a stream that ended at once): no latencies
                self.ttft[i] = self.tpot[i] = math.nan
                continue
            first, last = t[0], t[-1]
            ttft = first - r.request.arrival
            tpot = 0.0 if k == 1 else (last - first) / (k - 1)  # RequestRecord.tpot
            self.ttft[i], self.tpot[i] = ttft, tpot
            self.tokens[i] = k
            target = r.target
            if target is None:
                continue
            self.met[i] = ttft <= target.ttft and tpot <= target.tpot  # HyperFlexis Eq. 4
            times.append(np.frombuffer(t, dtype=np.float64))
            checked.append(i)
            base.append(r.request.arrival + target.ttft)
            step.append(target.tpot)
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
            self.met_dslo[np.asarray(checked)] = np.logical_and.reduceat(ok, starts)


def _values(column: np.ndarray, idx: np.ndarray) -> list[float]:
    return column[idx].tolist()


def _group(records: Sequence[RequestRecord], cols: _Columns, idx: np.ndarray) -> dict:
    n = len(idx)
    outcomes = [records[i].outcome for i in idx]
    done = idx[cols.finished[idx]]
    return {
        "requests": n,
        "finished": len(done),
        "rejected": outcomes.count(Outcome.REJECTED),
        "failed": outcomes.count(Outcome.FAILED),
        "shed": outcomes.count(Outcome.SHED),
        "best_effort": sum(records[i].best_effort for i in idx),
        "attainment": int(cols.met[idx].sum()) / n if n else 0.0,
        "attainment_dslo": int(cols.met_dslo[idx].sum()) / n if n else 0.0,
        "ttft": distribution(_values(cols.ttft, done)),
        "tpot": distribution(_values(cols.tpot, done)),
        "e2e": distribution(_values(cols.e2e, done)),
    }


def summarize_records(records: Sequence[RequestRecord]) -> dict:
    """Attainment and latency keys for one group of requests."""
    return _group(records, _Columns(records), np.arange(len(records)))


def summarize(records: Sequence[RequestRecord], spans: Iterable[tuple[float, float]]) -> dict:
    """The metric keys of the result JSON (DESIGN.md "Contracts")."""
    cols = _Columns(records)
    out = _group(records, cols, np.arange(len(records)))
    span = 0.0
    if cols.finished.any():
        start = min(r.request.arrival for r in records)
        last = max(cast(float, r.finish_time) for r, f in zip(records, cols.finished,
                                                               strict=True) if f)
        span = max(last - start, 1e-9)
    met = int(cols.met.sum())
    out["goodput_rps"] = met / span if span else 0.0
    out["throughput_rps"] = int(cols.finished.sum()) / span if span else 0.0
    out["output_tokens_per_s"] = int(cols.tokens.sum()) / span if span else 0.0
    out["cost_units"] = cost_units(spans)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r.request.task, []).append(i)
    out["per_task"] = {task: _group(records, cols, np.asarray(idx, dtype=np.int64))
                       for task, idx in groups.items()}
    levels: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        if r.request.priority is not None:
            levels.setdefault(r.request.priority, []).append(i)
    if levels:
        out["per_priority"] = {str(p): _group(records, cols, np.asarray(levels[p], dtype=np.int64))
                               for p in sorted(levels)}
    return out
