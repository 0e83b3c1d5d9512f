"""The comparison protocol: one probe set for both metrics, tuning that picks each
contender's best setting on the tuning workload, cells scored against the best peer."""

from __future__ import annotations

import pytest

from hfx.config import SimConfig
from hfx.evaluation import compare
from hfx.evaluation.compare import CONTENDERS, HFX, Contender, cells, dual_capacity, tune


def knees(eq4: float, deadline: float):
    """A fleet that meets Eq. 4 up to ``eq4`` QPS and the per-token deadlines up to
    ``deadline``; and the rates it was probed at."""
    seen: list[float] = []

    def probe(config: SimConfig) -> dict:
        seen.append(config.qps)
        return {"qps": config.qps, "attainment": 1.0 if config.qps <= eq4 else 0.5,
                "attainment_dslo": 1.0 if config.qps <= deadline else 0.5,
                "shed": 0, "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    return probe, seen


def test_both_metrics_come_from_one_set_of_probes():
    probe, seen = knees(37.0, 30.0)
    r = dual_capacity(SimConfig(qps=10, duration=60), 0.9, 0.02, probe)
    assert r["eq4"] == 36.875 and r["deadline"] == 30.0
    # Eq. 4's search probes 10 20 40 30 35 37.5 36.25 36.875; the deadline search takes 10 20
    # 40 30 35 from it and runs only where it parts: 32.5 31.25 30.625 30.3125.
    assert seen == [10, 20, 40, 30, 35, 37.5, 36.25, 36.875, 32.5, 31.25, 30.625, 30.3125]
    assert [p["qps"] for p in r["probes"]] == sorted(seen)
    alone = []
    for metric in ("attainment", "attainment_dslo"):
        p, s = knees(37.0, 30.0)
        compare.seed_capacity(SimConfig(qps=10, duration=60), 0.9, 0.02, p, metric)
        alone += s
    assert len(seen) < len(alone)


def test_tuning_keeps_each_contenders_best_setting_on_the_tuning_workload(monkeypatch):
    grid = ({"policy_params": {"theta": 0.7}}, {"policy_params": {"theta": 0.8}},
            {"policy_params": {"theta": 0.9}})
    monkeypatch.setitem(CONTENDERS, "toy", Contender("toy", {"policy": "hfx"}, grid))
    calls: list[SimConfig] = []

    def probe(config: SimConfig) -> dict:
        calls.append(config)
        # theta 0.8 is best under both metrics; 0.9 best under Eq. 4 alone
        knee = {0.7: (40, 40), 0.8: (60, 55), 0.9: (70, 20)}[config.policy_params["theta"]]
        return {"qps": config.qps, "attainment": 1.0 if config.qps <= knee[0] else 0.0,
                "attainment_dslo": 1.0 if config.qps <= knee[1] else 0.0,
                "shed": 0, "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    out = tune(["toy"], regimes=(256, 1024), jobs=1, probe=probe, progress=False)
    assert set(out["toy"]) == {"256", "1024"}
    assert out["toy"]["256"]["chosen"] == {"policy_params": {"theta": 0.8}}
    assert {c.workload for c in calls} == {compare.TUNING_WORKLOAD}
    assert {c.seed for c in calls} == {compare.TUNING_SEED}
    assert {c.max_num_seqs for c in calls} == {256, 1024}
    assert {c.duration for c in calls} == {compare.TUNING_RUN["duration"]}


def test_a_cell_scores_each_hfx_against_the_best_peer_and_never_against_itself():
    rows = [{"contender": n, "workload": "w", "regime": 256, "seed": s, "eq4": v + s,
             "deadline": v / 2}
            for n, v in (("hfx", 120), ("hfx-paper", 200), ("slos-serve", 100), ("rr", 80))
            for s in (0, 1)]
    eq4, deadline = cells(rows)
    assert eq4["metric"] == "eq4" and deadline["metric"] == "deadline"
    assert eq4["best_peer"] == "slos-serve"  # hfx-paper is higher, but HFX is no peer
    assert eq4["hfx_over_best_peer"] == pytest.approx(120.5 / 100.5)
    assert eq4["hfx-paper_over_best_peer"] == pytest.approx(200.5 / 100.5)
    assert eq4["capacities"]["rr"]["per_seed"] == [80, 81]
    assert set(HFX) <= set(eq4["capacities"])


def test_every_contender_fits_the_budget_and_builds():
    for c in CONTENDERS.values():
        assert 1 <= len(c.grid) <= 12
        for setting in c.grid:
            c.config(setting, workload="four-task")  # valid fields and parameters
    with pytest.raises(ValueError, match="1 to 12 settings"):
        Contender("big", {"policy": "rr"}, tuple({} for _ in range(13)))
    # The paper's HFX stays the paper's whatever tuning picks: override off, prefill-first.
    paper = CONTENDERS["hfx-paper"]
    for setting in paper.grid:
        config = paper.config(setting, workload="four-task")
        assert config.planner == "prefill-first" and config.policy_params["override"] == "off"


def test_slos_serve_admits_with_the_pace_its_engine_runs_at():
    """A tuned pace reaches both halves of SLOs-Serve: the planner's decode pace and the
    admission DP's step (t0 = pace × tightest TPOT)."""
    from hfx.sim.driver import resolve_profile, sim_cluster

    for setting in CONTENDERS["slos-serve"].grid:
        assert setting["policy_params"]["pace"] == setting["planner_params"]["pace"]
    config = CONTENDERS["slos-serve"].config(CONTENDERS["slos-serve"].grid[0],
                                             workload="four-task")
    control = sim_cluster(config, resolve_profile(config))
    assert control.policy.pace == 0.7
    assert {i.engine.planner.pace for i in control.instances.values()} == {0.7}
