"""bench/sim/miss_anatomy.py: its outcomes partition the scored requests as the simulator scores
them, and the Monitor it patches is put back."""

from __future__ import annotations

import pytest

from bench.sim.miss_anatomy import OUTCOMES, anatomy
from hfx.cluster.monitor import Monitor
from hfx.config import SimConfig
from hfx.sim.driver import simulate


@pytest.mark.parametrize(("policy", "metric", "workload", "qps", "fleet"), [
    ("hfx", "eq4", "two-task", 110.0, {}),
    # PolyServe's tiers and fleet, where a token's deadline and the mean TPOT part.
    ("scorpio", "deadline", "tiered-512-512", 60.0,
     {"model": "llama-3.1-8b", "hardware": "h200"})])
def test_outcomes_partition_the_scored_requests_as_the_simulator_scores_them(
        policy: str, metric: str, workload: str, qps: float, fleet: dict[str, str]) -> None:
    # Past each policy's knee: both lose requests, some queued out.
    cfg = SimConfig(workload=workload, policy=policy, planner="vllm", qps=qps, instances=2,
                    max_num_seqs=256, seed=3, duration=40.0, warmup=10.0, fold_records=False,
                    **fleet)
    collect = Monitor.collect
    row = anatomy(cfg, metric, period=None)
    assert Monitor.collect is collect
    result = simulate(cfg)
    assert row["requests"] == result["requests"]
    key = "attainment" if metric == "eq4" else "attainment_dslo"
    assert row["attainment"] == pytest.approx(result[key], abs=1e-12)
    if metric == "deadline":  # the metric chosen is the one counted
        assert result["attainment"] != result[key]
    counts = {k: sum(t[k] for t in row["tasks"].values()) for k in OUTCOMES}
    assert sum(counts.values()) == row["requests"]
    assert counts["queued_out"] > 0
    assert 0 < row["load"]["running_share"] <= 1
