"""Metrics over request records (HyperFlexis §3 and §7.5).

- attainment: seed Eq. 4, the fraction of *all* requests that finished with TTFT and mean TPOT
  within their SLO (rejected, shed, failed and aborted requests count as misses);
- attainment_dslo: the deadline-based variant (PolyServe §2.3);
- ttft / tpot / e2e: mean and percentiles over finished requests, in seconds;
- goodput_rps: requests that met their SLO per second of the run; throughput_rps: finished
  requests per second; both over the span from the first arrival to the last finish;
- cost_units: seed Eq. 3 with the unit of §7.5, one instance active for 50 ms; an instance is
  active from the moment it is provisioned until it is released, rounded up to whole units;
- hit_rate: prompt tokens found in an engine's prefix cache / prompt tokens, over finished
  requests (vLLM's prefix-cache hit rate, counted at each request's first admission).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from hfx.records.columns import NO_PRIORITY, RecordColumns, count_outcome
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


def distribution(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    if not len(values):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def group_counts(cols: RecordColumns, idx: np.ndarray | None = None) -> dict[str, int]:
    """The counts of one group (the records at ``idx``, or all of them) that its keys are
    made of (``group_keys``); counts add up across batches (hfx/records/streaming.py)."""
    def of(column: np.ndarray) -> np.ndarray:
        return column if idx is None else column[idx]

    outcome = of(cols.outcome)
    finished = of(cols.finished)
    return {
        "requests": len(outcome),
        "finished": int(of(cols.finished).sum()),
        "rejected": count_outcome(outcome, Outcome.REJECTED),
        "failed": count_outcome(outcome, Outcome.FAILED),
        "shed": count_outcome(outcome, Outcome.SHED),
        "best_effort": int(of(cols.best_effort).sum()),
        "met": int(of(cols.met).sum()),
        "met_dslo": int(of(cols.met_dslo).sum()),
        "prompt_tokens": int(of(cols.prompt)[finished].sum()),
        "cached_tokens": int(of(cols.cached)[finished].sum()),
    }


def group_keys(counts: dict[str, int], ttft: dict[str, float | None],
               tpot: dict[str, float | None], e2e: dict[str, float | None]) -> dict:
    """The keys of one group in the result JSON, from its counts and latency distributions."""
    n = counts["requests"]
    return {
        **{key: counts[key] for key in ("requests", "finished", "rejected", "failed", "shed",
                                        "best_effort")},
        "attainment": counts["met"] / n if n else 0.0,
        "attainment_dslo": counts["met_dslo"] / n if n else 0.0,
        "ttft": ttft,
        "tpot": tpot,
        "e2e": e2e,
        "cached_tokens": counts["cached_tokens"],
        "hit_rate": counts["cached_tokens"] / counts["prompt_tokens"]
        if counts["prompt_tokens"] else 0.0,
    }


def _group(cols: RecordColumns, idx: np.ndarray | None = None) -> dict:
    """The keys of one group: the records at ``idx``, or all of them."""
    done = cols.finished if idx is None else idx[cols.finished[idx]]
    return group_keys(group_counts(cols, idx), distribution(cols.ttft[done]),
                      distribution(cols.tpot[done]), distribution(cols.e2e[done]))


def longest_wait(cols: RecordColumns, end: float) -> float:
    """The longest any of ``cols``' requests went without a first token: until its first
    token, its end, or the stop at ``end`` (0 if none)."""
    until = np.where(np.isnan(cols.first),
                     np.where(np.isnan(cols.finish), end, cols.finish), cols.first)
    waits = until - cols.arrival
    return float(waits.max()) if len(waits) else 0.0


def summarize_records(records: Sequence[RequestRecord]) -> dict:
    """Attainment and latency keys for one group of requests."""
    return _group(RecordColumns.of(records, {}))


def summarize(records: Sequence[RequestRecord], spans: Iterable[tuple[float, float]]) -> dict:
    """The metric keys of the result JSON (DESIGN.md "Contracts")."""
    tasks: dict[str, int] = {}
    return summarize_columns(RecordColumns.of(records, tasks), list(tasks), spans)


def summarize_columns(cols: RecordColumns, task_names: Sequence[str],
                      spans: Iterable[tuple[float, float]]) -> dict:
    """``summarize`` of the records these are the columns of (``task`` indexing
    ``task_names``)."""
    out = _group(cols)
    span = 0.0
    if cols.finished.any():
        start = float(cols.arrival.min())
        last = float(cols.finish[cols.finished].max())
        span = max(last - start, 1e-9)
    out["goodput_rps"] = int(cols.met.sum()) / span if span else 0.0
    out["throughput_rps"] = out["finished"] / span if span else 0.0
    out["output_tokens_per_s"] = int(cols.tokens.sum()) / span if span else 0.0
    out["cost_units"] = cost_units(spans)
    # Groups in the order their first record comes.
    codes, first = np.unique(cols.task, return_index=True)
    out["per_task"] = {task_names[c]: _group(cols, np.flatnonzero(cols.task == c))
                       for c in codes[np.argsort(first, kind="stable")]}
    levels = np.unique(cols.priority[cols.priority != NO_PRIORITY])
    if len(levels):
        out["per_priority"] = {str(p): _group(cols, np.flatnonzero(cols.priority == p))
                               for p in levels.tolist()}
    return out
