"""Streaming metrics (hfx/records/streaming.py) against the exact ones, on the same runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hfx.config import SimConfig
from hfx.records.sketch import ALPHA, LatencySketch
from hfx.sim.driver import simulate


def close(approx: float | None, exact: float | None, rel: float) -> bool:
    if approx is None or exact is None:
        return approx is exact
    if math.isnan(exact):
        return math.isnan(approx)
    return abs(approx - exact) <= rel * abs(exact) + 1e-12


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1_000, 50_000])
def test_sketch_percentiles_are_within_alpha_of_numpys(n):
    rng = np.random.default_rng(n)
    values = rng.lognormal(-2.0, 1.5, n)
    values[rng.random(n) < 0.1] = 0.0  # one-token outputs have a TPOT of 0
    sketch = LatencySketch()
    for part in np.array_split(values, 7):  # folded in batches, as a run does
        sketch.add(part)
    for q in (0, 1, 50, 90, 99, 99.9, 100):
        exact = float(np.percentile(values, q))
        assert close(sketch.percentile(q), exact, ALPHA), (n, q, sketch.percentile(q), exact)
    assert sketch.mean() == pytest.approx(values.mean(), rel=1e-12)


def test_sketch_reports_nan_as_numpy_does():
    sketch = LatencySketch()
    sketch.add(np.array([0.1, math.nan, 0.3]))
    assert math.isnan(sketch.percentile(50)) and math.isnan(sketch.mean())
    with pytest.raises(ValueError, match="non-negative"):
        LatencySketch().add(np.array([-0.1]))


CASES = [
    {"policy": "hfx", "workload": "four-task", "qps": 160.0, "requests_per_task": 150},
    # Overloaded, steady state: a backlog at the end, requests shed past their TTFT.
    {"policy": "rr", "workload": "two-task", "qps": 90.0, "duration": 20.0, "warmup": 5.0,
     "drain": 0.0, "max_wait": 1.0},
    {"policy": "hfx", "workload": "four-task", "qps": 100.0, "requests_per_task": 100,
     "priorities": 3},
]


@pytest.mark.parametrize("case", CASES, ids=["hfx", "steady-rr", "priorities"])
def test_streaming_metrics_match_the_exact_ones(case):
    exact = simulate(SimConfig(**case))
    streamed = simulate(SimConfig(**case, metrics="streaming"))
    # Everything but the latency distributions is the same number.
    for key in ("requests", "finished", "rejected", "failed", "shed", "best_effort",
                "attainment", "attainment_dslo", "backlog_at_end", "max_wait", "engine_steps",
                "cost_units", "sim_seconds", "window"):
        assert streamed[key] == exact[key], key
    for key in ("goodput_rps", "throughput_rps", "output_tokens_per_s"):
        assert streamed[key] == pytest.approx(exact[key], rel=1e-12), key
    groups = [("all", streamed, exact)]
    assert list(streamed["per_task"]) == list(exact["per_task"])  # same order
    groups += [(t, streamed["per_task"][t], exact["per_task"][t]) for t in exact["per_task"]]
    assert list(streamed.get("per_priority", {})) == list(exact.get("per_priority", {}))
    groups += [(p, streamed["per_priority"][p], exact["per_priority"][p])
               for p in exact.get("per_priority", {})]
    for name, s, e in groups:
        assert (s["requests"], s["finished"], s["attainment"], s["attainment_dslo"]) == \
            (e["requests"], e["finished"], e["attainment"], e["attainment_dslo"]), name
        for metric in ("ttft", "tpot", "e2e"):
            assert close(s[metric]["mean"], e[metric]["mean"], 1e-9), (name, metric)
            for q in ("p50", "p90", "p99"):
                assert close(s[metric][q], e[metric][q], ALPHA), (name, metric, q)
    if case.get("duration"):
        assert exact["backlog_at_end"] > 0 and exact["shed"] > 0  # the case does what it says
