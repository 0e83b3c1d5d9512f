"""The comparison protocol: one probe set for both metrics, tuning that picks each
contender's best setting on the tuning workload, cells scored against the best peer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hfx.config import SimConfig
from hfx.engine.planners.deadline_chunked import DeadlineChunkedPlanner
from hfx.engine.planners.slo_paced import DEFAULT_PACE
from hfx.evaluation import compare
from hfx.evaluation.capacity import measured_bracket
from hfx.evaluation.compare import (
    CONTENDERS,
    HFX,
    CellBound,
    Contender,
    cells,
    dual_capacity,
    tune,
)


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


def two_slopes(eq4: float, deadline: float):
    """``sloped`` with a knee per metric; and the rates probed."""
    seen: list[float] = []

    def probe(config: SimConfig) -> dict:
        seen.append(config.qps)
        a, d = (max(0.0, min(1.0, 0.9 - (config.qps / k - 1) * 2)) for k in (eq4, deadline))
        return {"qps": config.qps, "attainment": a, "attainment_dslo": d, "shed": 0,
                "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    return probe, seen


def test_a_second_metric_bracketed_by_the_first_ones_probes_runs_none_of_its_own():
    # Per token the knee is 1% above Eq. 4's: inside the bracket Eq. 4's search ends on.
    probe, seen = two_slopes(150.0, 151.5)
    r = dual_capacity(SimConfig(qps=10, duration=60), 0.9, 0.03, probe,
                      {"eq4": 150.0, "deadline": 151.5})
    assert seen == [pytest.approx(147.75), pytest.approx(147.75 * 1.0297)]
    assert r["deadline"] == pytest.approx(147.75)
    assert r["deadline_warm_start"] == pytest.approx(151.5 * 0.985)  # its input, unused
    assert r["deadline_crossing"] == pytest.approx(151.5)
    assert r["eq4_crossing"] == pytest.approx(150.0)
    # A knee outside that bracket is searched from its own start.
    probe, seen = two_slopes(150.0, 156.0)
    r = dual_capacity(SimConfig(qps=10, duration=60), 0.9, 0.03, probe,
                      {"eq4": 150.0, "deadline": 156.0})
    assert len(seen) == 4 and r["deadline_warm_start"] == pytest.approx(156 * 0.985)
    assert r["deadline_crossing"] == pytest.approx(156.0)


def test_a_bracket_is_the_highest_passing_rate_and_the_least_rate_above_it():
    assert measured_bracket({100: .95, 102: .92, 104: .85, 110: .5}, 0.9, 0.03) == (102, 104)
    assert measured_bracket({100: .95, 103.5: .8}, 0.9, 0.03) is None  # wider than 3%
    assert measured_bracket({100: .9, 102: .8}, 0.9, 0.03) == (100, 102)  # at the target
    assert measured_bracket({100: .8, 102: .7}, 0.9, 0.03) is None  # nothing passes
    assert measured_bracket({100: .95}, 0.9, 0.03) is None  # nothing above fails
    # Not monotone: the highest passing rate, as the bisection reports.
    assert measured_bracket({100: .95, 102: .85, 104: .91, 106: .8}, 0.9, 0.03) == (104, 106)


def test_a_bracket_on_a_stopped_run_reads_the_whole_run_and_searches_on_if_it_passes(
        monkeypatch):
    def probe(config: SimConfig) -> dict:  # Eq. 4 holds to 152 req/s, per token to 162
        a = 0.95 if config.qps <= 152 else 0.85
        d = 0.95 if config.qps <= 162 else 0.85
        return {"qps": config.qps, "attainment": a, "attainment_dslo": d, "shed": 0,
                "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    def quick(probe_fn, target):
        def run(config: SimConfig) -> dict:  # a quick run above 155 stops, failing both
            if config.qps <= 155:
                return probe_fn(config)
            return {**probe_fn(config), "attainment": 0.5, "attainment_dslo": 0.5,
                    "stopped_at": 30.0}
        return run

    monkeypatch.setattr(compare, "quick_probe", quick)
    r = dual_capacity(SimConfig(qps=10, duration=60), 0.9, 0.05, probe)
    # Eq. 4's search doubles to 160 (stopped) and bisects to (150, 155). Per token its probes
    # give (155, 160), on the stopped run: run whole, 160 passes, and the per-token search
    # goes on past it to (160, 165).
    assert (r["eq4"], r["deadline"]) == (150, 160)
    assert [p["qps"] for p in r["probes"] if "stopped_at" not in p] == [
        10, 20, 40, 80, 120, 140, 150, 155, 160, 165]


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


def test_the_held_out_tuning_workload_shares_no_task_or_slo_with_an_evaluated_one():
    from hfx.workloads.tasks import BURSTY, TIERS, TTFTS, WORKLOADS

    held = WORKLOADS[compare.HELD_OUT]
    for name in (*compare.WORKLOADS, compare.TUNING_WORKLOAD):
        base = BURSTY[name][0] if name in BURSTY else name
        for task in WORKLOADS.get(base, ()):
            assert all(t.name != task.name and t.slo != task.slo for t in held), (name, task)
    tiered = {(tpot, ttft) for tpot, _ in TIERS for ttft in TTFTS}
    assert not {(t.slo.tpot, t.slo.ttft) for t in held} & tiered
    calls: list[SimConfig] = []

    def probe(config: SimConfig) -> dict:
        calls.append(config)
        return {"qps": config.qps, "attainment": float(config.qps <= 9.0),
                "attainment_dslo": float(config.qps <= 9.0), "shed": 0, "backlog_at_end": 0,
                "max_wait": 0.0, "requests": 1}

    tune(["rr"], regimes=(256,), jobs=1, probe=probe, progress=False, workload=compare.HELD_OUT)
    assert calls and {c.workload for c in calls} == {"slos-serve-mixed"}
    assert {c.seed for c in calls} == {compare.TUNING_SEED}


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


def test_a_cell_says_when_the_goal_is_not_the_dispatchers_to_meet():
    def rows(rr: float) -> list[dict]:
        return [{"contender": n, "workload": w, "regime": 256, "seed": 0, "eq4": v,
                 "deadline": v} for w in ("a", "b")
                for n, v in (("hfx", 120.0), ("slos-serve", 100.0), ("rr", rr))]

    # Round robin within 3% of the best contender (HFX here): fleet-bound.
    eq4 = cells(rows(117.0))[0]
    assert eq4["rr_share"] == pytest.approx(117 / 120) and eq4["note"] == "fleet-bound"
    assert cells(rows(116.0))[0]["note"] == ""
    # 1.2x the best peer (120) above the work bound: no dispatcher meets the goal there; above
    # the blind bound only: none that knows no output length before it ends.
    a, _, b, _ = cells(rows(80.0), {("a", 256): CellBound(119.0, 110.0),
                                    ("b", 256): CellBound(130.0, 119.0)})
    assert (a["note"], b["note"]) == ("goal above the bound", "goal above the blind bound")
    assert a["bound"] == 119.0 and a["hfx_over_bound"] == pytest.approx(120 / 119)
    assert b["blind_bound"] == 119.0 and b["hfx_over_blind"] == pytest.approx(120 / 119)
    assert "| 119.0 / 110.0 | 101% / 109% | goal above the bound |" in compare.headline([a])
    assert cells(rows(80.0), {("a", 256): CellBound(130.0, 121.0)})[0]["note"] == ""
    # A workload with no blind bound (a trace): the work bound alone decides.
    none = cells(rows(80.0), {("a", 256): CellBound(130.0, None)})[0]
    assert none["note"] == "" and "hfx_over_blind" not in none
    assert "| 130.0 / – | 92% / – |" in compare.headline([none])


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
    setting = next(s for s in CONTENDERS["slos-serve"].grid
                   if s["policy_params"]["pace"] == 0.7)  # not the shipped pace
    config = CONTENDERS["slos-serve"].config(setting, workload="four-task")
    control = sim_cluster(config, resolve_profile(config))
    assert control.policy.pace == 0.7
    assert {i.engine.planner.pace for i in control.instances.values()} == {0.7}


def linear(knees: dict[float, float], key: str = "theta"):
    """A fleet whose attainment falls 2 points per request/s, through 90% at the setting's
    knee (both metrics alike)."""
    def probe(config: SimConfig) -> dict:
        knee = knees[config.policy_params.get(key, 0.0)]
        a = max(0.0, min(1.0, 0.9 + (knee - config.qps) * 0.02))
        return {"qps": config.qps, "attainment": a, "attainment_dslo": a, "shed": 0,
                "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    return probe


def test_the_crossing_resolves_what_the_bisection_leaves_on_one_grid_point():
    r = compare.seed_capacity(SimConfig(qps=60, duration=60), 0.9, 0.05, linear({0.0: 50.5}))
    assert r["capacity"] == 48.75  # the bracket's low end, 3.5% short of the knee
    assert r["crossing"] == pytest.approx(50.5)


def test_tuning_tells_apart_settings_the_bisection_ties_and_says_how(monkeypatch):
    grid = ({"policy_params": {"theta": 0.7}}, {"policy_params": {"theta": 0.8}})
    monkeypatch.setitem(CONTENDERS, "toy", Contender("toy", {"policy": "hfx"}, grid))
    monkeypatch.setitem(compare.TUNING_RUN, "tolerance", 0.05)
    out = tune(["toy"], regimes=(256,), jobs=1, probe=linear({0.7: 49.0, 0.8: 50.5}),
               progress=False)["toy"]["256"]
    # Both bisect to 48.75; the second's crossing is higher, so it is chosen, not the first.
    assert [r["eq4"] for r in out["results"]] == [48.75, 48.75]
    assert out["chosen"] == {"policy_params": {"theta": 0.8}}


def test_a_row_written_before_the_crossing_was_recorded_gets_it_from_its_probes():
    row = {"eq4": 40.0, "probes": [{"qps": 40.0, "attainment": 0.95, "attainment_dslo": 1.0},
                                   {"qps": 50.0, "attainment": 0.7, "attainment_dslo": 1.0},
                                   {"qps": 60.0, "attainment": 0.4, "attainment_dslo": 1.0}]}
    assert compare.resolved(row, "eq4") == pytest.approx(42.0)  # 0.95 → 0.7 crosses 0.9 at 42
    assert compare.resolved({**row, "eq4_crossing": 41.0}, "eq4") == 41.0


def test_a_table_is_rendered_from_one_commit_only():
    rows = [{"contender": "hfx", "commit": "abc"}, {"contender": "rr", "commit": "abc"}]
    assert compare.one_commit(rows) == "abc"
    with pytest.raises(ValueError, match=r"abc: hfx; def: rr, slos-serve"):
        compare.one_commit([rows[0], {"contender": "rr", "commit": "def"},
                            {"contender": "slos-serve", "commit": "def"}])
    with pytest.raises(ValueError, match="not recorded: rr"):
        compare.one_commit([{"contender": "rr"}])


def test_on_one_engine_every_contender_runs_its_planner_without_its_planners_knobs():
    hfx = CONTENDERS["hfx"]
    grid = hfx.grid_on("vllm")
    assert len(grid) == 6 and all("planner_params" not in s for s in grid)  # 12 less slack_share
    config = hfx.config(hfx.grid[0], "vllm", workload="four-task")
    assert config.planner == "vllm" and config.planner_params == {}
    assert CONTENDERS["hfx-paper"].config({}, "vllm", workload="four-task").planner == "vllm"
    assert hfx.grid_on(None) == hfx.grid


def test_a_fleet_given_for_the_run_is_every_probes_over_each_workloads_own():
    calls: list[SimConfig] = []

    def probe(config: SimConfig) -> dict:
        calls.append(config)
        return {"qps": config.qps, "attainment": 1.0 if config.qps <= 50 else 0.0,
                "attainment_dslo": 1.0 if config.qps <= 50 else 0.0,
                "shed": 0, "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    fleet = {"model": "llama-3-70b", "hardware": "h200"}
    tuned = tune(["rr"], regimes=(256,), jobs=1, probe=probe, progress=False, fleet=fleet)
    rows = compare.evaluate(tuned, ["four-task", "tiered-512-512"], [0], (256,), jobs=1,
                            probe=probe, progress=False, fleet=fleet)
    assert {(c.model, c.hardware) for c in calls} == {("llama-3-70b", "h200")}
    assert {c.workload for c in calls} == {compare.TUNING_WORKLOAD, "four-task",
                                           "tiered-512-512"}
    assert [(r["workload"], r["model"], r["hardware"]) for r in rows] == [
        ("four-task", "llama-3-70b", "h200"), ("tiered-512-512", "llama-3-70b", "h200")]
    # Without one, each workload keeps its own: PolyServe's tiered setting on its H200 fleet.
    calls.clear()
    compare.evaluate(tuned, ["four-task", "tiered-512-512"], [0], (256,), jobs=1, probe=probe,
                     progress=False)
    assert {(c.workload, c.model, c.hardware) for c in calls} == {
        ("four-task", "qwen2.5-7b", "ascend-910b"), ("tiered-512-512", "llama-3.1-8b", "h200")}


def test_a_fleet_of_more_instances_runs_every_probe_on_it_from_a_start_in_proportion():
    calls: list[SimConfig] = []

    def probe(config: SimConfig) -> dict:
        calls.append(config)
        ok = 1.0 if config.qps <= 400 else 0.0
        return {"qps": config.qps, "attainment": ok, "attainment_dslo": ok, "shed": 0,
                "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    tuned = {"rr": {"256": {"chosen": {}}}}
    rows = compare.evaluate(tuned, ["four-task"], [0], (256,), jobs=1, probe=probe,
                            progress=False, fleet={"instances": 16})
    assert {c.instances for c in calls} == {16}
    # Four-task's search starts at 8x its 2-instance rate.
    assert calls[0].qps == compare.START["four-task"] * 8
    assert rows[0]["instances"] == 16
    # The work bound is the 16-instance fleet's: 8x the same workload's on 2.
    bound16 = compare.cell_bounds(rows)[("four-task", 256)]
    bound2 = compare.cell_bounds([{**rows[0], "instances": 2}])[("four-task", 256)]
    assert bound16.work == pytest.approx(8 * bound2.work, rel=0.02)
    assert bound16.blind == pytest.approx(8 * bound2.blind, rel=0.02)


def sloped(knee: float):
    """A fleet whose attainment falls 2 points per 1% of rate, through 90% at ``knee``
    (both metrics); and the rates it was probed at."""
    seen: list[float] = []

    def probe(config: SimConfig) -> dict:
        seen.append(config.qps)
        a = max(0.0, min(1.0, 0.9 - (config.qps / knee - 1) * 2))
        return {"qps": config.qps, "attainment": a, "attainment_dslo": a, "shed": 0,
                "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    return probe, seen


def test_a_search_started_from_an_earlier_result_brackets_its_capacity_in_two_probes():
    tuned = {"rr": {"256": {"chosen": {}}}}
    probe, seen = sloped(150.0)
    cold = compare.evaluate(tuned, ["four-task"], [0], (256,), jobs=1, probe=probe,
                            progress=False)
    assert len(seen) == 7 and cold[0]["eq4_crossing"] == pytest.approx(150.0)
    seen.clear()
    warm = compare.evaluate(tuned, ["four-task"], [0], (256,), jobs=1, probe=probe,
                            progress=False, earlier={"searches": cold})
    # Half a tolerance (3%) below the earlier crossing, then just under one tolerance up:
    # the bracket, for both metrics at once.
    assert seen == [pytest.approx(150 * 0.985), pytest.approx(150 * 0.985 * 1.0297)]
    assert warm[0]["eq4_warm_start"] == pytest.approx(147.75)
    assert warm[0]["eq4_crossing"] == pytest.approx(150.0)
    assert warm[0]["deadline_crossing"] == pytest.approx(150.0)
    # A search with no earlier row of its own (another seed) starts cold.
    seen.clear()
    compare.evaluate(tuned, ["four-task"], [1], (256,), jobs=1, probe=probe, progress=False,
                     earlier={"searches": cold})
    assert seen[0] == compare.START["four-task"]


def test_a_warm_search_whose_capacity_moved_far_still_finds_it():
    probe, seen = sloped(600.0)
    found = compare.dual_capacity(SimConfig(qps=10, duration=60), 0.9, 0.03, probe,
                                  warm={"eq4": 150.0, "deadline": 150.0})
    assert found["eq4_crossing"] == pytest.approx(600.0)
    # Steps grow from 3% to doubling: fewer probes than stepping by 3% throughout would take.
    assert len(seen) <= 12


def test_tuning_starts_each_settings_search_from_the_earlier_tuning_of_that_setting():
    probe, seen = sloped(80.0)
    first = tune(["scorpio"], regimes=(256,), jobs=1, probe=probe, progress=False)
    n_settings = len(CONTENDERS["scorpio"].grid)
    cold = len(seen)
    seen.clear()
    tune(["scorpio"], regimes=(256,), jobs=1, probe=probe, progress=False,
         earlier={"tuning": first})
    assert len(seen) == 2 * n_settings < cold
    # A tuning on another workload starts none of them: its capacities are another knee's.
    seen.clear()
    held = tune(["scorpio"], regimes=(256,), jobs=1, probe=probe, progress=False,
                workload=compare.HELD_OUT)
    cold_held = len(seen)
    seen.clear()
    tune(["scorpio"], regimes=(256,), jobs=1, probe=probe, progress=False,
         earlier={"tuning": first}, workload=compare.HELD_OUT)
    assert len(seen) == cold_held > 2 * n_settings
    seen.clear()
    tune(["scorpio"], regimes=(256,), jobs=1, probe=probe, progress=False,
         workload=compare.HELD_OUT,
         earlier={"tuning": held, "protocol": {"tuning_workload": compare.HELD_OUT}})
    assert len(seen) == 2 * n_settings


def test_a_warm_search_on_a_larger_fleet_starts_from_the_earlier_capacity_in_proportion():
    tuned = {"rr": {"256": {"chosen": {}}}}
    probe, seen = sloped(150.0)
    two = compare.evaluate(tuned, ["four-task"], [0], (256,), jobs=1, probe=probe,
                           progress=False)
    seen.clear()
    compare.evaluate(tuned, ["four-task"], [0], (256,), jobs=1, probe=probe, progress=False,
                     fleet={"instances": 16}, earlier={"searches": two})
    assert seen[0] == pytest.approx(8 * 150 * 0.985)


def test_tuning_keeps_the_setting_listed_first_unless_another_beats_it_beyond_the_resolution():
    tie = compare.TUNING_TIE
    # The best leads the first by less than the resolution: a tie, the first is kept.
    assert compare.choose([100.0, 100.0 * (1 + tie) * 0.999, 90.0]) == 0
    # Beyond it, the best is chosen; and among several within it of the best, the first of them.
    assert compare.choose([100.0, 104.0, 105.0]) == 1
    assert compare.choose([100.0, 90.0, 103.0]) == 2
    assert compare.choose([0.0, 0.0]) == 0


def test_every_grid_lists_the_policys_shipped_setting_first():
    import inspect

    from hfx.policies import POLICIES

    for c in CONTENDERS.values():
        params = c.grid[0].get("policy_params", {})
        signature = inspect.signature(POLICIES[c.fields["policy"]].__init__).parameters
        own = c.fields.get("policy_params", {})  # the contender's fixed params over the class's
        assert params == {k: own.get(k, signature[k].default) for k in params}, c.name
    assert CONTENDERS["hfx"].grid[0]["planner_params"] == {
        "slack_share": DeadlineChunkedPlanner.slack_share}
    assert CONTENDERS["slos-serve"].grid[0]["planner_params"] == {"pace": DEFAULT_PACE}


ROOT = Path(__file__).resolve().parents[1]


def bench_script(name: str):
    """bench/experiments/NAME.py as a module (a script, not in the package)."""
    spec = importlib.util.spec_from_file_location(
        f"{name}_script", ROOT / "bench" / "experiments" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def compare_script():
    return bench_script("compare")


def _git_repo(path: Path):
    """A new git repository at ``path``, and a function that runs git there."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    return git


def test_a_mixed_table_names_the_package_files_its_commits_differ_in(tmp_path):
    script = compare_script()
    git = _git_repo(tmp_path)
    (tmp_path / "hfx").mkdir()
    for name in ("sglang.py", "hfx.py"):
        (tmp_path / "hfx" / name).write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "a")
    first = git("rev-parse", "--short", "HEAD")
    (tmp_path / "hfx" / "sglang.py").write_text("x = 2\n")
    (tmp_path / "notes.md").write_text("not the package\n")
    git("add", ".")
    git("commit", "-qm", "b")
    second = git("rev-parse", "--short", "HEAD")
    assert script.code_between({first, second}, tmp_path) == (
        f"hfx/ between {min(first, second)} and {max(first, second)}: hfx/sglang.py")
    assert script.code_between({first, "0000000"}, tmp_path).endswith("(not in this checkout)")


def test_a_rerun_merged_into_the_table_it_writes_keeps_the_other_contenders(tmp_path, monkeypatch):
    import json
    import sys

    script = compare_script()
    table = tmp_path / "table.json"
    earlier = json.loads((ROOT / "docs/data/compare_whole/own_engines_1024_20.json").read_text())
    earlier["commands"] = ["python compare.py --first", "python compare.py --second"]
    table.write_text(json.dumps(earlier))
    others = [r for r in earlier["searches"] if r["contender"] != "hfx"]
    rerun = [dict(r, commit="new", eq4=r["eq4"] + 1.0) for r in earlier["searches"]
             if r["contender"] == "hfx" and r["workload"] == "tiered-512-512"]
    monkeypatch.setattr(script, "evaluate", lambda tuned, workloads, *a, **k: [
        r for r in rerun if r["workload"] in workloads])
    # --merge and --json name one file: the merge must be read before the tuning is written.
    monkeypatch.setattr(sys, "argv", [
        "compare.py", "--regimes", "1024", "--instances", "20", "--seeds", "0,1",
        "--workloads", "tiered-512-512", "--contenders", "hfx", "--tuned", str(table),
        "--merge", str(table), "--json", str(table)])
    assert script.main() == 0
    result = json.loads(table.read_text())
    assert result["searches"] == others + rerun
    assert set(result["tuning"]) == set(earlier["tuning"])
    assert result["merged_from"]["contenders"] == sorted(set(earlier["tuning"]) - {"hfx"})
    # The runs behind the kept searches, then this one.
    assert result["commands"] == [*earlier["commands"], result["command"]]


def test_a_table_that_takes_its_tuning_says_what_workload_that_tuning_ran_on(tmp_path,
                                                                             monkeypatch):
    import json
    import sys

    script = compare_script()
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"protocol": {"tuning_workload": compare.HELD_OUT,
                                              "tuning_seed": 7},
                                 "tuning": {"rr": {"1024": {"settings": [{}], "scores": [9.0],
                                                            "chosen": {}}}}}))
    out = tmp_path / "table.json"
    monkeypatch.setattr(sys, "argv", [
        "compare.py", "--regimes", "1024", "--workloads", "none", "--contenders", "rr",
        "--tuned", str(tuned), "--json", str(out)])
    assert script.main() == 0
    protocol = json.loads(out.read_text())["protocol"]
    assert (protocol["tuning_workload"], protocol["tuning_seed"]) == (compare.HELD_OUT, 7)


def _table(commit: str, probes: list[tuple[float, float]], warm: float | None) -> dict:
    from hfx.evaluation.compare import warm_start

    start, _ = warm_start(warm, 0.03)
    row = {"contender": "rr", "workload": "four-task", "seed": 0, "regime": 1024,
           "commit": commit, "eq4_warm_start": start, "deadline_warm_start": start,
           "eq4": probes[0][0], "deadline": probes[0][0],
           "eq4_crossing": probes[0][0] * 1.01, "deadline_crossing": probes[0][0] * 1.01,
           "probes": [{"qps": q, "attainment": a, "attainment_dslo": a} for q, a in probes]}
    return {"searches": [row], "tuning": {}}


def test_reproduce_finds_the_input_a_tables_run_had_and_names_a_search_that_differs(tmp_path):
    import json

    script = bench_script("reproduce")
    git = _git_repo(tmp_path)
    path = tmp_path / "table.json"
    older = _table("aaa", [(100.0, 0.91), (103.0, 0.88)], None)
    run = _table("bbb", [(99.0, 0.905), (102.0, 0.89)], 100.0 * 1.01)
    path.write_text(json.dumps(older))
    git("add", ".")
    git("commit", "-qm", "the earlier run")
    path.write_text(json.dumps(run))
    git("commit", "-qam", "the run lands")
    path.write_text(json.dumps({**run, "table": "rendered again"}))  # same searches
    git("commit", "-qam", "re-rendered")
    landed, warm = script.run_input("table.json", "bbb", tmp_path)
    assert git("log", "-1", "--format=%s", landed) == "the run lands"  # not the re-render
    assert warm == older
    assert script.check_warm(run, warm, 2) == []  # the recorded warm starts came from it
    assert len(script.check_warm(run, _table("aaa", [(90.0, 0.9)], None), 2)) == 2
    # At 76151fa a per-token search the probes bracketed within 3% kept no start.
    skipped = json.loads(json.dumps(run))
    del skipped["searches"][0]["deadline_warm_start"]
    skipped["searches"][0]["probes"][1]["qps"] = 101.5
    assert script.check_warm(skipped, warm, 2) == []
    unbracketed = json.loads(json.dumps(skipped))
    unbracketed["searches"][0]["probes"][1]["attainment_dslo"] = 0.95
    assert len(script.check_warm(unbracketed, warm, 2)) == 1

    same = script.compare(run, json.loads(json.dumps(run)))
    assert (same["identical"], same["differ"]) == (1, [])
    moved = json.loads(json.dumps(run))
    moved["searches"][0]["probes"][1]["attainment_dslo"] += 1e-12
    found = script.compare(run, moved)
    assert found["identical"] == 0
    assert found["differ"][0]["search"] == ["rr", "four-task", 0, 1024]
