"""Fair shares between tenants (hfx/cluster/fair_share.py): the virtual token counter's order,
its lift, its correction at the end, and the control plane holding and releasing requests."""

from __future__ import annotations

import pytest

from hfx.cluster.fair_share import FairShare
from hfx.request import SLO, Request


def req(rid: str, tenant: str, prompt: int = 10, out: int = 10, priority: int | None = None
        ) -> Request:
    return Request(rid, 0.0, prompt, out, SLO(1.0, 0.1), priority=priority, tenant=tenant)


def test_without_saturation_every_request_passes_and_is_charged():
    fair = FairShare()
    assert fair.arrive(req("a1", "a", prompt=10, out=5), saturated=False)
    assert fair.counters == {"a": 10 + 2 * 5} and fair.num_held == 0


def test_saturated_the_tenant_with_the_least_service_goes_first():
    fair = FairShare()
    for i in range(3):  # a flood from a, charged as it passed
        fair.arrive(req(f"a{i}", "a"), saturated=False)
    for i in range(3):
        assert not fair.arrive(req(f"a{i + 3}", "a"), saturated=True)
    assert not fair.arrive(req("b0", "b"), saturated=True)
    assert not fair.arrive(req("b1", "b"), saturated=True)
    # b is lifted to a's counter (90: it banks nothing for arriving late); the tie goes by
    # name, then each release puts its tenant 30 ahead, so they alternate.
    room = iter([False] * 5 + [True])
    order = [r.id for r in fair.release(lambda: next(room))]
    assert order == ["a3", "b0", "a4", "b1", "a5"]
    assert fair.num_held == 0


def test_a_weight_divides_the_charge():
    fair = FairShare({"gold": 2.0})
    for i in range(4):
        assert not fair.arrive(req(f"g{i}", "gold"), saturated=True)
        assert not fair.arrive(req(f"s{i}", "silver"), saturated=True)
    room = iter([False] * 6 + [True])
    order = [r.id[0] for r in fair.release(lambda: next(room))]
    assert order.count("g") == 4 and order.count("s") == 2  # twice the share


def test_a_higher_band_goes_first_and_no_request_overtakes_a_held_one():
    fair = FairShare()
    assert not fair.arrive(req("low", "a", priority=3), saturated=True)
    assert not fair.arrive(req("high", "b", priority=0), saturated=True)
    # Not saturated now, but others wait: it queues behind them rather than overtake.
    assert not fair.arrive(req("later", "c", priority=3), saturated=False)
    assert [r.id for r in fair.release(lambda: False)] == ["high", "low", "later"]


def test_the_end_corrects_the_charge_and_withdraw_forgets_a_held_request():
    fair = FairShare()
    fair.arrive(req("a0", "a", prompt=10, out=100), saturated=False)
    assert fair.counters["a"] == 210
    fair.finished("a0", tokens=5)  # it stopped early: charged for 5, not 100
    assert fair.counters["a"] == 20 and fair.outstanding == {}
    assert not fair.arrive(req("a1", "a"), saturated=True)
    assert fair.withdraw("a1") and not fair.withdraw("a1")
    assert fair.num_held == 0 and list(fair.release(lambda: False)) == []


def test_a_tenant_back_from_idle_banks_no_credit():
    fair = FairShare()
    fair.arrive(req("b0", "b"), saturated=False)
    fair.finished("b0", 10)  # b served 30, then idle
    for i in range(10):
        fair.arrive(req(f"a{i}", "a"), saturated=False)  # a served 300 meanwhile
    assert not fair.arrive(req("b1", "b"), saturated=True)
    assert fair.counters["b"] == 300  # lifted to a's: it does not get 270 tokens ahead


def test_a_bad_weight_is_refused():
    with pytest.raises(ValueError, match="tenant 'x'"):
        FairShare({"x": 0.0})
