"""Steady-state runs, capacity by bisection, and step-time noise."""

from __future__ import annotations

import json
import statistics

import pytest
from pydantic import ValidationError

from hfx.config import SimConfig
from hfx.engine.executor import StepNoise
from hfx.evaluation.capacity import capacity, seed_capacity, unreachable
from hfx.sim.driver import simulate
from hfx.workloads.kinds import load_workload
from hfx.workloads.load import generate


def test_a_duration_gives_poisson_arrivals_for_that_long_per_task():
    reqs = generate("four-task", qps=40, seed=0, duration=100)
    assert all(0 <= r.arrival < 100 for r in reqs)
    assert abs(len(reqs) - 4000) < 4 * 4000 ** 0.5  # Poisson: within 4 sigma
    per_task = [sum(r.task == t for r in reqs) for t in {r.task for r in reqs}]
    assert len(per_task) == 4 and min(per_task) > 900
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
    assert generate("four-task", 40, 0, duration=100) == reqs  # seeded
    assert len(load_workload("tiered-512-512", 20, 0, duration=50)) in range(850, 1150)


def test_an_overloaded_steady_run_stops_on_time_and_counts_its_backlog():
    cfg = SimConfig(policy="rr", workload="two-task", qps=400, instances=1, duration=30,
                    warmup=10, drain=5, step_noise=0)
    r = simulate(cfg)
    assert r["sim_seconds"] == pytest.approx(35.0)  # the arrivals, then the bounded drain
    assert r["window"] == [10, 30] and r["drain"] == 5
    measured = [x for x in generate("two-task", 400, 0, duration=30) if x.arrival >= 10]
    assert r["requests"] == len(measured)
    assert r["backlog_at_end"] > 1000  # one instance cannot keep up with 400 QPS
    assert r["finished"] + r["rejected"] + r["shed"] + r["failed"] < r["requests"]
    assert r["max_wait"] >= 5.0  # a request that arrived at the end still waits at the stop
    assert r["attainment"] < 0.5


def test_a_light_steady_run_drains_and_misses_nothing_by_the_bound():
    r = simulate(SimConfig(policy="hfx", qps=4, duration=60, warmup=10))
    assert r["backlog_at_end"] == 0 and r["drain"] == 60
    assert r["sim_seconds"] < 60 + 60  # it ended when the last request did
    assert r["attainment"] > 0.95 and r["max_wait"] < 2.0


def test_a_finite_run_keeps_the_seeds_shape():
    r = simulate(SimConfig(policy="rr", qps=20, requests_per_task=20))
    assert r["window"] is None and r["drain"] is None and r["backlog_at_end"] == 0
    assert r["requests"] == 80


@pytest.mark.parametrize("fields, message", [
    ({"warmup": 10}, "--warmup needs --duration"),
    ({"duration": 10, "warmup": 10}, "must be shorter"),
    ({"duration": 10, "workload": "ramp"}, "sets its own arrivals"),
    ({"duration": float("inf")}, "finite number"),
])
def test_steady_state_settings_are_checked(fields, message):
    with pytest.raises(ValidationError, match=message):
        SimConfig(**fields)


def fake_probe(knee: float):
    """A fleet that meets the target up to ``knee`` QPS and not beyond."""
    seen: list[float] = []

    def probe(config: SimConfig) -> dict:
        seen.append(config.qps)
        return {"qps": config.qps, "attainment": 1.0 if config.qps <= knee else 0.5,
                "shed": 0, "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    return probe, seen


def test_capacity_brackets_by_doubling_then_bisects_to_the_tolerance():
    probe, seen = fake_probe(37.0)
    r = seed_capacity(SimConfig(qps=10, duration=60), 0.9, 0.02, probe)
    assert seen == [10, 20, 40, 30, 35, 37.5, 36.25, 36.875]
    assert r["capacity"] == 36.875 and [p["qps"] for p in r["probes"]] == seen
    probe, seen = fake_probe(37.0)
    r = seed_capacity(SimConfig(qps=100, duration=60), 0.9, 0.1, probe)
    assert seen == [100, 50, 25, 37.5, 31.25, 34.375]  # halving to a bracket first
    assert r["capacity"] == 34.375


def test_a_capacity_search_no_rate_can_win_is_refused_before_any_probe():
    # PolyServe's tiers on the 910B profile: one decode step (~25 ms) misses the 20 ms tier,
    # and 4,096-token prompts miss the 300 ms TTFTs, whatever the rate.
    probe, seen = fake_probe(37.0)
    slow = SimConfig(workload="tiered-512-512", qps=10, duration=60)
    lost, why = unreachable(slow)
    assert lost == pytest.approx(0.1) and len(why) == 3  # the 20 ms tier, with each TTFT
    assert unreachable(slow.model_copy(update={"workload": "tiered-4096-1024"}))[0] == \
        pytest.approx(0.1 + 0.9 / 3)  # the 20 ms tier, and the 300 ms TTFT of every other
    with pytest.raises(ValueError, match="no rate attains 90%"):
        seed_capacity(slow, 0.9, 0.02, probe)
    assert seen == []
    assert seed_capacity(slow, 0.85, 0.02, probe)["capacity"] > 0  # a reachable target
    fast = slow.model_copy(update={"model": "llama-3.1-8b", "hardware": "h200"})
    assert unreachable(fast) == (0.0, [])
    assert unreachable(SimConfig(workload="four-task")) == (0.0, [])


def test_capacity_of_a_real_fleet_over_seeds():
    cfg = SimConfig(policy="rr", workload="two-task", instances=1, qps=20, duration=30,
                    warmup=5, drain=5)
    r = capacity(cfg, seeds=2, tolerance=0.1, jobs=1)
    caps = [s["capacity"] for s in r["seeds"]]
    assert [s["seed"] for s in r["seeds"]] == [0, 1]
    assert r["capacity_mean"] == pytest.approx(statistics.fmean(caps))
    assert 5 < min(caps) <= max(caps) < 200
    for s in r["seeds"]:  # the capacity met the target, and a rate ≤ 10% above it did not
        ok = [p for p in s["probes"] if p["attainment"] >= 0.9]
        bad = [p for p in s["probes"] if p["attainment"] < 0.9]
        assert max(p["qps"] for p in ok) == s["capacity"]
        assert min(p["qps"] for p in bad) <= s["capacity"] * 1.1


def test_step_noise_has_mean_one_the_asked_spread_and_a_seed():
    noise = StepNoise(0.1, (0, 1))
    draws = [noise.factor() for _ in range(20000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.005)
    assert statistics.stdev(draws) == pytest.approx(0.1, abs=0.005)
    again = StepNoise(0.1, (0, 1))
    assert [again.factor() for _ in range(3)] == draws[:3]
    assert StepNoise(0.1, (0, 2)).factor() != draws[0]
    assert StepNoise(0.0, 0).factor() == 1.0


def test_noisy_runs_are_seeded_and_the_policy_still_predicts_with_the_profile():
    base = dict(policy="hfx", qps=120, requests_per_task=40)
    exact = simulate(SimConfig(**base, step_noise=0))
    a = simulate(SimConfig(**base, step_noise=0.1))
    b = simulate(SimConfig(**base, step_noise=0.1))
    other = simulate(SimConfig(**base, step_noise=0.1, seed=1))
    assert a["e2e"] == b["e2e"]  # the same seed, the same run
    assert a["e2e"] != exact["e2e"] and a["e2e"] != other["e2e"]


def test_a_sweep_over_seeds_reports_the_mean_and_spread():
    from hfx.evaluation.sweep import aggregate, capacity_table, run_grid, table

    results = run_grid(SimConfig(requests_per_task=100), [("rr", {"policy": "rr"})], [60, 400],
                       jobs=1, progress=False, seeds=2)
    assert [(r["qps"], r["seed"]) for r in results] == [(60, 0), (60, 1), (400, 0), (400, 1)]
    rows = aggregate(results)
    assert [(r["qps"], r["seeds"]) for r in rows] == [(60, 2), (400, 2)]
    att = [r["attainment"] for r in results[2:]]
    assert att[0] != att[1]  # the seeds differ
    assert rows[1]["attainment"] == pytest.approx(statistics.fmean(att))
    assert rows[1]["attainment_std"] == pytest.approx(statistics.stdev(att))
    assert "± std" in table(results)
    assert capacity_table(results).startswith("finite-trace knee")


def test_the_bursty_workload_cycles_half_and_two_and_a_half_times_the_mean_rate():
    reqs = load_workload("bursty-four-task", 40, 0, duration=400)
    assert all(r.arrival < 400 for r in reqs)
    assert abs(len(reqs) - 40 * 400) < 4 * (40 * 400) ** 0.5  # the mean rate is --qps
    in_burst = sum((r.arrival % 40) >= 30 for r in reqs)  # 10 of every 40 s at 2.5×
    assert in_burst / len(reqs) == pytest.approx(25 / 40, abs=0.02)
    assert {r.task for r in reqs} == {"medical_qa", "tldr_content_gen", "tldr_headline_gen",
                                      "wikisql"}
    finite = load_workload("bursty-four-task", 40, 0, 400)  # 1,600 requests: 1 cycle of 40 s
    assert max(r.arrival for r in finite) < 40 and abs(len(finite) - 1600) < 160


def test_on_a_trace_capacity_searches_the_traces_own_rate():
    """A trace's arrivals are rescaled (``--trace-qps``), its requests as they are: the search
    starts at the trace's own mean rate and varies that; ``qps`` is not read."""
    from pathlib import Path

    from hfx.evaluation.capacity import rate_of, steady

    trace = str(Path(__file__).parent / "golden" / "traces" / "sessions.jsonl")
    config = SimConfig(workload=trace, slo_map="default=2000:500", qps=999)
    assert steady(config).duration is None  # the trace as it is, start to end
    own = rate_of(config)
    rows = [line for line in Path(trace).read_text().splitlines() if line.strip()]
    assert own > 0 and own == pytest.approx(len(rows) / (
        (json.loads(rows[-1])["timestamp"] - json.loads(rows[0])["timestamp"]) / 1e3))
    seen: list[tuple[float, float | None]] = []

    def probe(c: SimConfig) -> dict:
        seen.append((c.qps, c.trace_qps))
        return {"attainment": 1.0 if (c.trace_qps or 0) <= 3 * own else 0.5, "shed": 0,
                "backlog_at_end": 0, "max_wait": 0.0, "requests": 1}

    r = seed_capacity(config, 0.9, 0.05, probe)
    assert all(q == 999 for q, _ in seen) and seen[0][1] == own
    assert [t for _, t in seen[:3]] == [own, 2 * own, 4 * own]
    assert 3 * own * 0.95 <= r["capacity"] <= 3 * own


# ---- probes that end once they fail (hfx/sim/miss_watch.py) ---------------------------------


def test_a_run_that_cannot_reach_the_target_ends_there_and_one_that_can_is_the_same_run():
    over = SimConfig(policy="rr", workload="four-task", instances=1, max_num_seqs=64, qps=60,
                     duration=60, warmup=10, seed=1)
    whole, cut = simulate(over), simulate(over, stop_below=0.9)
    assert whole["attainment"] < 0.9 and whole["attainment_dslo"] < 0.9
    assert "stopped_at" not in whole and 10 < cut["stopped_at"] < 60
    # Stopped, its attainments are a truncated run's: below the target, as the whole run's.
    assert cut["attainment"] < 0.9 and cut["attainment_dslo"] < 0.9
    assert cut["sim_seconds"] == cut["stopped_at"] < whole["sim_seconds"]
    # Met with hundreds of requests open at once (two 1,024-sequence instances): open is not
    # late.
    met = SimConfig(policy="hfx", workload="four-task", qps=150, duration=30, warmup=5, seed=1)
    a, b = simulate(met), simulate(met, stop_below=0.9)
    assert b.pop("stopped_at") is None and a["attainment"] >= 0.9
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b  # the watch reads state only
    # A target the whole run reaches, however narrowly, never stops it: at 25 req/s it ends
    # at 0.413, and watched for 0.4 it runs to the same end.
    near = over.model_copy(update={"qps": 25})
    a, b = simulate(near), simulate(near, stop_below=0.4)
    assert 0.4 <= a["attainment"] < 0.42 and b.pop("stopped_at") is None
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b


def test_the_search_runs_its_crossings_failing_rate_whole():
    """The quick probe's failing runs read lower than whole ones; the capacity comes from
    pass or fail alone, and the crossing from the least failing rate run whole."""
    whole_runs: list[float] = []

    def row(attainment: float, stopped: float | None = None) -> dict:
        return {"attainment": attainment, "shed": 0, "backlog_at_end": 0, "max_wait": 0.0,
                "requests": 1, "stopped_at": stopped}

    def whole(c: SimConfig) -> dict:
        whole_runs.append(c.qps)
        return row(1.0 if c.qps <= 37 else 0.85)

    def quick(c: SimConfig) -> dict:
        return row(1.0) if c.qps <= 37 else row(0.2, stopped=5.0)

    r = seed_capacity(SimConfig(qps=10, duration=60), 0.9, 0.02, whole, quick=quick)
    assert r["capacity"] == 36.875
    assert whole_runs == [37.5]  # the least failing rate, once, whole
    # Linear between 36.875 (1.0) and 37.5 (0.85, whole) at 0.9.
    assert r["crossing"] == pytest.approx(36.875 + 0.625 * (0.1 / 0.15))
    assert [p.get("stopped_at") for p in r["probes"] if p["qps"] == 37.5] == [5.0, None]
