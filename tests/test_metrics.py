"""HyperFlexis Eq. 3 and Eq. 4, and the deadline-based SLO of PolyServe, on hand-made records."""

from __future__ import annotations

from array import array

import pytest

from hfx.records.metrics import cost_units, summarize, summarize_records
from hfx.request import SLO, Outcome, Request, RequestRecord

SLO_DEFAULT = SLO(1.0, 0.5)


def record(times, slo=SLO_DEFAULT, arrival=0.0, outcome=Outcome.FINISHED, task="t"):
    r = RequestRecord(Request("r", arrival, 10, max(1, len(times)), slo, task=task))
    r.token_times = array("d", times)
    r.outcome = outcome
    r.finish_time = times[-1] if times else None
    return r


def test_eq4_needs_ttft_and_mean_tpot():
    assert record([0.9, 1.3, 1.8]).meets_slo()  # TTFT 0.9, mean TPOT 0.45
    assert not record([1.1, 1.2, 1.3]).meets_slo()  # TTFT missed
    assert not record([0.5, 1.2, 1.6]).meets_slo()  # mean TPOT 0.55 missed
    # One long gap is fine for Eq. 4 if the mean holds...
    assert record([0.2, 1.1, 1.2, 1.3]).meets_slo()
    # ...and a single token has no TPOT to miss.
    assert record([0.7]).meets_slo()
    # Only finished requests can attain.
    assert not record([0.1, 0.2], outcome=Outcome.ABORTED).meets_slo()


def test_deadline_slo_checks_every_token():
    # token i by arrival + TTFT + i*TPOT = 1.0, 1.5, 2.0, 2.5
    assert record([1.0, 1.5, 2.0, 2.5]).meets_deadline_slo()
    assert not record([0.2, 1.1, 2.1, 2.2]).meets_deadline_slo()  # token 2 late (2.1 > 2.0)
    # Arrival shifts every deadline.
    assert record([11.0, 11.5], arrival=10.0).meets_deadline_slo()
    assert not record([11.0, 11.6], arrival=10.0).meets_deadline_slo()


def test_eq4_and_dslo_differ_both_ways():
    # A slow start recovered by fast tokens: Eq. 4 fails on TTFT, and so does DSLO.
    late_first = record([1.2, 1.3, 1.4])
    assert not late_first.meets_slo() and not late_first.meets_deadline_slo()
    # A late stall within the deadlines passes both; an early one fails only DSLO.
    stall = record([0.1, 0.2, 0.3, 0.4, 2.1, 2.2])  # mean TPOT 0.42; token 4 due by 3.0
    assert stall.meets_slo() and stall.meets_deadline_slo()
    early_stall = record([0.1, 1.7, 1.8, 1.9, 2.0, 2.1])  # token 1 due by 1.5
    assert early_stall.meets_slo() and not early_stall.meets_deadline_slo()


def test_eq3_cost_in_50ms_units():
    assert cost_units([(0.0, 1.0)]) == 20
    assert cost_units([(0.0, 1.0), (0.5, 0.65)]) == 23  # 0.15 s is 3 units, not 4
    assert cost_units([(0.0, 0.01)]) == 1  # a started unit counts
    assert cost_units([]) == 0
    with pytest.raises(ValueError):
        cost_units([(2.0, 1.0)])


def test_attainment_counts_unfinished_requests_as_misses():
    recs = [record([0.5, 0.6]), record([0.5, 0.6]), record([], outcome=Outcome.REJECTED),
            record([0.1], outcome=Outcome.FAILED)]
    s = summarize_records(recs)
    assert s["requests"] == 4 and s["finished"] == 2
    assert s["attainment"] == 0.5
    assert s["rejected"] == 1 and s["failed"] == 1
    assert s["ttft"]["mean"] == pytest.approx(0.5)


def test_summary_keys_goodput_and_per_task():
    recs = [record([0.5, 0.6], task="a"), record([2.0, 2.1], task="b")]
    s = summarize(recs, [(0.0, 2.1), (0.0, 2.1)])
    assert s["cost_units"] == 84
    assert s["goodput_rps"] == pytest.approx(1 / 2.1)
    assert s["throughput_rps"] == pytest.approx(2 / 2.1)
    assert s["per_task"]["a"]["attainment"] == 1.0 and s["per_task"]["b"]["attainment"] == 0.0
    for key in ("ttft", "tpot", "e2e"):
        assert set(s[key]) == {"mean", "p50", "p90", "p99"}
