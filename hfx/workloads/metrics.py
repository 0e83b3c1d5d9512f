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


def _group(records: Sequence[RequestRecord], met: Sequence[bool],
           met_dslo: Sequence[bool]) -> dict:
    n = len(records)
    finished = [r for r in records if r.outcome is Outcome.FINISHED]
    # A finished request has its tokens and its finish time: no None below.
    return {
        "requests": n,
        "finished": len(finished),
        "rejected": sum(r.outcome is Outcome.REJECTED for r in records),
        "failed": sum(r.outcome is Outcome.FAILED for r in records),
        "shed": sum(r.outcome is Outcome.SHED for r in records),
        "best_effort": sum(r.best_effort for r in records),
        "attainment": sum(met) / n if n else 0.0,
        "attainment_dslo": sum(met_dslo) / n if n else 0.0,
        "ttft": distribution(cast("list[float]", [r.ttft for r in finished])),
        "tpot": distribution(cast("list[float]", [r.tpot for r in finished])),
        "e2e": distribution(cast("list[float]", [r.e2e for r in finished])),
    }


def summarize_records(records: Sequence[RequestRecord]) -> dict:
    """Attainment and latency keys for one group of requests."""
    return _group(records, [r.meets_slo() for r in records],
                  [r.meets_deadline_slo() for r in records])


def summarize(records: Sequence[RequestRecord], spans: Iterable[tuple[float, float]]) -> dict:
    """The metric keys of the result JSON (DESIGN.md "Contracts")."""
    met = [r.meets_slo() for r in records]
    met_dslo = [r.meets_deadline_slo() for r in records]
    out = _group(records, met, met_dslo)
    finished = [r for r in records if r.outcome is Outcome.FINISHED]
    span = 0.0
    if finished:
        start = min(r.request.arrival for r in records)
        span = max(max(cast(float, r.finish_time) for r in finished) - start, 1e-9)
    out["goodput_rps"] = sum(met) / span if span else 0.0
    out["throughput_rps"] = len(finished) / span if span else 0.0
    out["output_tokens_per_s"] = sum(r.num_tokens for r in finished) / span if span else 0.0
    out["cost_units"] = cost_units(spans)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r.request.task, []).append(i)
    out["per_task"] = {
        task: _group([records[i] for i in idx], [met[i] for i in idx], [met_dslo[i] for i in idx])
        for task, idx in groups.items()
    }
    levels: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        if r.request.priority is not None:
            levels.setdefault(r.request.priority, []).append(i)
    if levels:
        out["per_priority"] = {
            str(p): _group([records[i] for i in levels[p]], [met[i] for i in levels[p]],
                           [met_dslo[i] for i in levels[p]])
            for p in sorted(levels)
        }
    return out
