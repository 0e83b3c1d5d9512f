"""HFX-PM (HyperFlexis Algorithm 2, Eq. 6) on hand-made windows, and priority runs end to end."""

from __future__ import annotations

import json

import pytest

from hfx.cluster.slo_mapper import PriorityMapper, PriorityRange, eq6_index
from hfx.config import SimConfig
from hfx.request import SLO
from hfx.sim.driver import simulate
from hfx.workloads.load import load_trace, priority_levels
from hfx.workloads.tasks import TASKS

WIDE = PriorityRange(SLO(0.01, 0.01), SLO(100.0, 100.0))


def test_eq6_indices():
    counts = [2, 3, 1]  # N = 3
    assert eq6_index(0, counts) == 0 + (1 * 2) // 4  # 0
    assert eq6_index(1, counts) == 2 + (2 * 3) // 4  # 3
    assert eq6_index(2, counts) == 5 + (3 * 1) // 4  # 5
    assert eq6_index(3, [0, 0, 0, 10]) == 8  # ⌊4/5·10⌋: a low priority reads a high quantile


def filled() -> PriorityMapper:
    m = PriorityMapper([WIDE, WIDE, WIDE])
    for p, ttft, q, tpot in ((0, 0.1, 0.0, 0.01), (0, 0.2, 0.05, 0.02), (1, 0.5, 0.1, 0.05),
                             (1, 0.4, 0.2, 0.04), (1, 0.3, 0.0, 0.03), (2, 1.0, 0.5, 0.1)):
        m.observe(p, ttft, q, tpot)
    return m


def test_assign_reads_the_sorted_windows_at_the_eq6_index():
    m = filled()
    assert m.counts == [2, 3, 1]
    # index 3 of TTFTs sorted [0.1 0.2 0.3 0.4 0.5 1.0] and of TPOTs [.01 .02 .03 .04 .05 .1]
    assert m.assign(1, higher_pending=False) == SLO(0.4, 0.04)
    assert m.assign(0, higher_pending=False) == SLO(0.1, 0.01)
    assert m.assign(2, higher_pending=False) == SLO(1.0, 0.1)


def test_queue_time_correction():
    m = filled()
    assert m.assign(1, False) == SLO(0.4, 0.04)  # reference queue time 0.2; first: Δ = 0
    m.observe(0, 0.45, 0.6, 0.045)  # lands at index 4 = p1's new index
    # Reference (0.45, q = 0.6): Δ = 0.6 − 0.2, so TTFT = 0.45 − 0.4.
    slo = m.assign(1, False)
    assert (slo.ttft, slo.tpot) == (pytest.approx(0.05), 0.045)


def test_clamping_and_the_contention_rule():
    ranges = [PriorityRange(SLO(0.1, 0.01), SLO(0.2, 0.02)),
              PriorityRange(SLO(0.3, 0.03), SLO(0.6, 0.06))]
    m = PriorityMapper(ranges)
    for ttft, tpot in ((0.05, 0.005), (0.06, 0.006), (0.07, 0.007)):
        m.observe(1, ttft, 0.0, tpot)
    # Higher priority pending: the strict lower bound of p1's range.
    assert m.assign(1, higher_pending=True) == SLO(0.3, 0.03)
    # Nobody more important waiting: relaxed down to the strictest range's lower bound.
    assert m.assign(1, higher_pending=False) == SLO(0.1, 0.01)
    m2 = PriorityMapper(ranges)
    for _ in range(3):
        m2.observe(0, 5.0, 0.0, 1.0)
    assert m2.assign(1, False) == SLO(0.6, 0.06)  # the upper bound always holds
    assert m2.assign(0, True) == SLO(0.2, 0.02)


def test_empty_window_falls_back_to_the_range_and_window_slides():
    r = PriorityRange.around(SLO(1.0, 0.4))
    assert (r.lo.ttft, r.hi.ttft, r.lo.tpot, r.hi.tpot) == pytest.approx((0.75, 1.25, 0.3, 0.5))
    m = PriorityMapper([r], window=2)
    slo = m.assign(0, False)
    assert (slo.ttft, slo.tpot) == pytest.approx((1.0, 0.4))
    for x in (1.0, 2.0, 3.0):
        m.observe(0, x, 0.0, x / 10)
    assert m.counts == [2]  # the oldest left the window
    with pytest.raises(ValueError, match="0 is the most important"):
        m.assign(1, False)


def test_priority_levels_follow_ttft_strictness():
    of_task, nominal = priority_levels([TASKS[n] for n in ("wikisql", "medical_qa",
                                                           "tldr_headline_gen")], 3)
    assert of_task == {"medical_qa": 0, "tldr_headline_gen": 1, "wikisql": 2}
    assert nominal == [SLO(0.7, 0.5), SLO(2.0, 0.9), SLO(20.0, 1.0)]
    _, two = priority_levels([TASKS["gsm8k"], TASKS["sharegpt"], TASKS["medical_qa"]], 2)
    assert len(two) == 2
    with pytest.raises(ValueError):
        priority_levels([TASKS["gsm8k"]], 2)


def test_priority_run_reports_per_priority_and_is_deterministic():
    def once():
        r = simulate(SimConfig(policy="hfx", qps=120, requests_per_task=40, priorities=4))
        r.pop("wall_seconds")
        return r

    a, b = once(), once()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert set(a["per_priority"]) == {"0", "1", "2", "3"}
    assert a["finished"] == 160 and a["rejected"] == 0


def test_trace_rows_with_priority_only(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"arrival": 0, "input_len": 50, "output_len": 5, "priority": 0}\n'
                    '{"arrival": 0.1, "input_len": 50, "output_len": 5, "priority": 1}\n'
                    '{"arrival": 0.2, "input_len": 50, "output_len": 5, "priority": 7}\n')
    reqs = load_trace(path)
    assert [r.slo for r in reqs] == [None, None, None]
    r = simulate(SimConfig(workload=str(path), priorities=2))
    assert (r["finished"], r["rejected"]) == (2, 1)  # priority 7 of 2 levels: a clear rejection
    no_pm = simulate(SimConfig(workload=str(path)))
    assert no_pm["rejected"] == 3  # priorities without mapping are refused, not guessed
