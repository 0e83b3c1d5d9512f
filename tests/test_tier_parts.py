"""HFX's tier parts (hfx/policies/tier_parts.py): the sizes, when they are on, where each tier's
requests go, and the queue moving between the host dispatcher and the parts."""

from __future__ import annotations

import itertools

import pytest

from hfx.engine import Role
from hfx.engine.stats import InstanceStats
from hfx.policies import make_policy
from hfx.policies.base import ClusterView, InstanceView
from hfx.policies.hfx import HFXDispatcher
from hfx.policies.tier_parts import bottleneck_split, demand, peak
from hfx.request import SLO, Request
from hfx.stepmodel.latency import Profile, StepTimeModel

# Eq. 2's fixed step cost a = 30 ms: a 50 ms TPOT leaves 40% of an instance's time, 0.5 s 94%.
MODEL = StepTimeModel(0.02, 1e-4, 0.0, 0.03, 0.0, 1e-4)
PROFILE = Profile("t", MODEL, kv_capacity_tokens=100_000)


def view(now: float, n: int, used: int = 0) -> ClusterView:
    stats = [InstanceStats(i, Role.COLOCATED, now, 0, 0, 0, used, 0, 6250, 16, 0, 256, 0.0, 0)
             for i in range(n)]
    return ClusterView(now, [InstanceView(i, Role.COLOCATED, s) for i, s in enumerate(stats)],
                       MODEL, PROFILE)


def arrivals(pol: HFXDispatcher, tpots: tuple[float, ...], each: int, now: float = 0.0
             ) -> list[Request]:
    reqs = [Request(f"t{tpot}-{k}", now, 100, 10, SLO(1.0, tpot))
            for k in range(each) for tpot in tpots]
    for r in reqs:
        pol.enqueue(r, now)
    return reqs


def test_bottleneck_split_makes_the_most_loaded_part_as_light_as_any_split_can():
    """PolyServe §5.1's tiers on a 7.2 ms step: needs 0.156, 0.263, 0.350, 0.431, and 3/4/6/7
    of 20; on every small case, no split of the instances has a lighter bottleneck."""
    need = demand([0.1, 0.2, 0.3, 0.4], [0.02, 0.03, 0.05, 0.1], 0.0072)
    assert [round(x, 3) for x in need] == [0.156, 0.263, 0.35, 0.431]
    assert bottleneck_split(need, 20) == [3, 4, 6, 7]
    for need in ([1.0, 1.0, 10.0], [0.3, 2.0, 0.7], [5.0, 1.0, 1.0, 1.0]):
        for total in range(len(need), 11):
            sizes = bottleneck_split(need, total)
            assert sum(sizes) == total and min(sizes) >= 1
            best = min(peak(need, list(c))
                       for c in itertools.product(range(1, total + 1), repeat=len(need))
                       if sum(c) == total)
            assert peak(need, sizes) == pytest.approx(best)


def test_each_tier_goes_to_its_own_part_on_a_fleet_where_the_strict_pace_costs():
    """Two tiers alike in load, 50 ms and 0.5 s, on 12 instances: the 50 ms one needs 2.35x
    the fleet (1 / 0.4 against 1 / 0.94), so it gets instances 0–7 and the 0.5 s one 8–11,
    and no request leaves its part."""
    pol = make_policy("hfx")
    assert isinstance(pol, HFXDispatcher)
    reqs = arrivals(pol, (0.05, 0.5), 6)
    d = pol.schedule(view(0.0, 12))
    assert pol._tiers is not None and pol._tiers.active
    assert pol._tiers.split == {**dict.fromkeys(range(8), 0.05), **dict.fromkeys(range(8, 12), 0.5)}
    placed = {x.request.id: x.instance for x in d.dispatch}
    assert len(placed) == len(reqs)  # every one placed: idle instances
    assert all((placed[r.id] < 8) == (r.slo.tpot == 0.05) for r in reqs), placed
    assert pol.num_queued() == 0


@pytest.mark.parametrize(("tpots", "n", "why"), [
    ((0.5, 1.0), 12, "the looser pace saves nothing"),
    ((0.1, 0.3), 12, "the parts' bottleneck 7% lighter: under 10%"),
    ((0.05, 0.5), 5, "fewer than 3 instances a tier"),
    ((0.05,), 12, "one tier"),
])
def test_the_parts_stay_off_where_they_cannot_pay(tpots, n, why):
    """Off, the host dispatcher decides alone: the same placements as with ``parts="off"``."""
    pol, plain = make_policy("hfx"), make_policy("hfx", parts="off")
    assert isinstance(pol, HFXDispatcher)
    for p in (pol, plain):
        arrivals(p, tpots, 4)
    d, d_plain = pol.schedule(view(0.0, n)), plain.schedule(view(0.0, n))
    assert pol._tiers is not None and not pol._tiers.active, why
    assert [(x.request.id, x.instance) for x in d.dispatch] == [
        (x.request.id, x.instance) for x in d_plain.dispatch]


def test_the_queue_moves_into_the_parts_when_they_start_and_back_when_they_stop():
    """Requests the host queued before the parts started are theirs after, still withdrawable;
    when the fleet shrinks below three instances a tier, they come back to the host."""
    pol = make_policy("hfx")
    assert isinstance(pol, HFXDispatcher) and pol._tiers is not None
    # Full instances (no free KV): nothing is placed, everything stays queued.
    full = view(0.0, 12, used=6250)
    reqs = arrivals(pol, (0.05, 0.5), 3)
    pol.schedule(full)
    assert pol._tiers.active and pol._tiers.num_queued() == len(reqs) == pol.num_queued()
    assert len(pol.queue) == 0  # the host holds none of them
    assert pol.withdraw(reqs[0].id) and pol.num_queued() == len(reqs) - 1
    assert not pol.withdraw(reqs[0].id)
    pol.schedule(view(0.1, 4, used=6250))  # a new fleet size: sized again at once
    assert not pol._tiers.active and pol._tiers.num_queued() == 0
    assert pol._queued_here() == len(reqs) - 1 == pol.num_queued()


def test_a_fleet_too_small_for_parts_still_counts_every_arrival_when_it_grows():
    """Below six instances no split can start, so arrivals are priced only once the fleet can
    hold parts: grown to 12, the parts start at once, with the same loads to the last bit and
    the same split as a dispatcher that saw 12 instances from the first arrival."""
    small, large = make_policy("hfx"), make_policy("hfx")
    assert isinstance(small, HFXDispatcher) and isinstance(large, HFXDispatcher)
    for t, n in ((0.0, 4), (0.5, 4), (1.0, 12)):
        for pol, size in ((small, n), (large, 12)):
            arrivals(pol, (0.05, 0.5), 3, now=t)
            pol.schedule(view(t, size, used=6250))  # full: everything stays queued
        assert small._tiers is not None and large._tiers is not None
        assert small._tiers.active == (n == 12)
    assert small._tiers.load == large._tiers.load and small._tiers.load
    assert small._tiers.split == large._tiers.split


def test_a_prefill_stage_and_the_seeds_dispatcher_have_no_parts():
    from hfx.evaluation.presets import SEED_DISPATCHER
    from hfx.policies import make_pd_policies

    prefill, _ = make_pd_policies("hfx")
    assert isinstance(prefill, HFXDispatcher) and prefill._tiers is None
    seed = make_policy("hfx", **SEED_DISPATCHER)
    assert isinstance(seed, HFXDispatcher) and seed._tiers is None
    with pytest.raises(ValueError, match="parts must be one of"):
        make_policy("hfx", parts="always")
