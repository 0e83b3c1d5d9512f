"""Policy rules pinned on hand-worked examples: Eq. 5, the maturity update, SCORPIO's credits,
SA's moves and objective, the shared output-length predictor, and every policy end to end."""

from __future__ import annotations

import math
import random

import pytest
from conftest import make_engine, seq

from hfx.config import SimConfig
from hfx.engine import Role
from hfx.engine.stats import InstanceStats
from hfx.policies import POLICIES, ClusterView, InstanceView, make_pd_policies, make_policy
from hfx.policies import sa as sa_module
from hfx.policies.deadline_queue import DeadlineQueue
from hfx.policies.hfx import HFXDispatcher, maturity_time, token_budget
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.prefill_demand import PrefillDemand, guard_floor
from hfx.policies.sa_search import Job, anneal, delay, evaluate, objective, squeeze, swap
from hfx.policies.scorpio import TPOTMix
from hfx.policies.shadow import ShadowInstance
from hfx.request import SLO, Outcome, Request, RequestRecord
from hfx.sim.driver import simulate
from hfx.stepmodel.latency import Profile, StepTimeModel


# ---- HFX -------------------------------------------------------------------------------------
def test_eq5_token_budget():
    # (0.7·0.5 − 0.7·0.1 − 0.02·0.5) / (1e-4·0.5) = 0.27 / 5e-5
    assert token_budget(0.7, 0.5, 0.1, 0.02, 1e-4) == pytest.approx(5400)
    # An idle instance (E_d = 0): (TTFT − a) / b.
    assert token_budget(0.7, 0.5, 0.0, 0.02, 1e-4) == pytest.approx(6800)
    # A batch already at its TPOT leaves nothing.
    assert token_budget(0.7, 0.5, 0.5, 0.02, 1e-4) < 0


def test_maturity_update():
    # relax = 0.5 − 0.1; now + E_p + (E_p / relax)·E_d = 10 + 0.2 + 0.5·0.1
    assert maturity_time(10.0, 0.2, 0.1, 0.5) == pytest.approx(10.25)
    # relax ≤ 0: one decode iteration after the prefill.
    assert maturity_time(10.0, 0.2, 0.6, 0.5) == pytest.approx(10.8)


MODEL = StepTimeModel(0.02, 1e-4, 0.0, 0.03, 0.0, 1e-4)
PROFILE = Profile("t", MODEL, kv_capacity_tokens=100_000)
PD_MODEL = StepTimeModel(0.02, 1e-4, 0.0, 0.01, 1e-5, 1e-3)  # E_d = 0.01 + 1e-5·ctx + 1e-3·B


def view(now: float, n: int = 1, running: int = 0, ctx: int = 0) -> ClusterView:
    stats = [InstanceStats(i, Role.COLOCATED, now, 0, running, 0, ctx // 16, 0, 6250, 16, ctx, 256,
                           0.0, 0) for i in range(n)]
    return ClusterView(now, [InstanceView(i, Role.COLOCATED, s) for i, s in enumerate(stats)],
                       MODEL, PROFILE)


def req(rid: str, arrival: float, prompt: int, ttft: float, tpot: float) -> Request:
    return Request(rid, arrival, prompt, 10, SLO(ttft, tpot))


def test_hfx_dispatches_strict_tpot_first_and_sets_maturity():
    pol = make_policy("hfx")
    pol.enqueue(req("loose", 0.0, 100, 20.0, 1.0), 0.0)
    pol.enqueue(req("strict", 0.0, 100, 0.7, 0.2), 0.0)
    d = pol.schedule(view(0.0))
    assert [x.request.id for x in d.dispatch] == ["strict", "loose"]
    # Both in one batch: E_p = 0.02 + 1e-4·200; E_d with both joined = 0.03 + 2e-4;
    # maturity = E_p + E_p / (0.2 − E_d) · E_d.
    e_p, e_d = 0.04, 0.0302
    assert pol.maturity[0] == pytest.approx(e_p + e_p / (0.2 - e_d) * e_d)
    assert d.wake_at is None  # nothing left queued


@pytest.mark.parametrize("margin", [1.0, 0.9])
def test_hfx_tpot_margin_aims_eq5_and_the_payback_at_a_share_of_each_target(margin):
    pol = make_policy("hfx", tpot_margin=margin)
    assert isinstance(pol, HFXDispatcher)
    pol.enqueue(req("loose", 0.0, 100, 20.0, 1.0), 0.0)
    pol.enqueue(req("strict", 0.0, 100, 0.7, 0.2), 0.0)
    pol.schedule(view(0.0))
    # As above, with the strict 0.2 s kept at margin × 0.2: a longer payback below 1.
    e_p, e_d = 0.04, 0.0302
    assert pol.maturity[0] == pytest.approx(e_p + e_p / (margin * 0.2 - e_d) * e_d)
    assert pol.room(pol.shadow[0], MODEL, e_d) == pytest.approx(
        token_budget(0.7, margin * 0.2, e_d, 0.02, 1e-4))


@pytest.mark.parametrize("margin", [0.0, -0.1, 1.01, "0", "sometimes"])
def test_hfx_tpot_margin_outside_0_1_is_refused(margin):
    with pytest.raises(ValueError, match="tpot_margin"):
        make_policy("hfx", tpot_margin=margin)


def test_learned_tpot_margin_rests_at_the_target_and_tightens_only_the_target_that_misses():
    from hfx.policies.tpot_margin import FLOOR, MISS_RATE, STEP, TPOTMargins

    m = TPOTMargins()
    for _ in range(500):
        m.observe(0.05, 0.049)  # met: stays at the whole target
    assert m.aim(0.05) == 0.05
    m.observe(0.03, 0.031)
    assert m.share(0.03) == pytest.approx(1 - STEP * (1 - MISS_RATE))
    assert m.share(0.05) == 1.0  # another target's misses do not move it
    for _ in range(49):  # 1 miss in 50: the rate it rests at
        m.observe(0.03, 0.029)
    assert m.share(0.03) == pytest.approx(1.0)
    for _ in range(1000):
        m.observe(0.03, 0.04)
    assert m.share(0.03) == FLOOR


def _finished(rid: str, tpot_target: float, times: list[float]) -> RequestRecord:
    from array import array

    r = req(rid, 0.0, 100, 5.0, tpot_target)
    return RequestRecord(r, 0.0, 0, token_times=array("d", times), finish_time=times[-1],
                         outcome=Outcome.FINISHED)


def test_hfx_learns_a_tighter_aim_from_requests_that_missed_their_tpot():
    """The guard (Eq. 5, the payback) aims at the learned share; the seed's dispatcher
    ("off") keeps aiming at the whole target."""
    learned, seed = make_policy("hfx"), make_policy("hfx", tpot_margin="off")
    assert isinstance(learned, HFXDispatcher) and isinstance(seed, HFXDispatcher)
    v = view(1.0)
    for pol in (learned, seed):
        pol.enqueue(req("r0", 0.0, 100, 5.0, 0.2), 0.0)
        pol.schedule(view(0.0))
        # Ten tokens 0.25 s apart: a 0.2 s target missed.
        pol.on_finished(_finished("r0", 0.2, [0.1 + 0.25 * k for k in range(10)]), v)
    assert seed.aim(0.2) == 0.2
    from hfx.policies.tpot_margin import MISS_RATE, STEP

    assert learned.aim(0.2) == pytest.approx(0.2 * (1 - STEP * (1 - MISS_RATE)))
    assert learned.aim(0.5) == 0.5
    assert learned._eq5(5.0, 0.2, 0.03, MODEL) == pytest.approx(
        token_budget(5.0, learned.aim(0.2), 0.03, 0.02, 1e-4))


def test_hfx_budget_limits_a_batch_and_waits_for_maturity():
    pol = make_policy("hfx")
    # Eq. 5 on an idle instance: (0.7 − 0.02) / 1e-4 = 6800 tokens: two 2500-token prompts fit
    # (E_p = 0.52 s, well inside the 0.7 s TTFT), a third does not.
    for i in range(3):
        pol.enqueue(req(f"r{i}", 0.0, 2500, 0.7, 0.5), 0.0)
    d = pol.schedule(view(0.0))
    assert [x.request.id for x in d.dispatch] == ["r0", "r1"]
    assert d.wake_at == pytest.approx(pol.maturity[0]) and d.wake_at > 0
    assert pol.num_queued() == 1


def test_hfx_keeps_the_batch_within_its_earliest_deadline():
    pol = make_policy("hfx")
    # Within the budget, but two 3300-token prompts take E_p = 0.68 s: r0 (deadline 0.7 s) would
    # likely miss, so r1 waits.
    for i in range(2):
        pol.enqueue(req(f"r{i}", 0.0, 3300, 0.7, 0.5), 0.0)
    d = pol.schedule(view(0.0))
    assert [x.request.id for x in d.dispatch] == ["r0"]


def test_hfx_hopeless_request_is_best_effort_after_feasible_ones():
    pol = make_policy("hfx", best_effort="drained")
    pol.enqueue(req("late", 0.0, 100, 0.7, 0.5), 0.0)  # arrived 5 s ago: TTFT lost
    pol.enqueue(req("fresh", 5.0, 100, 0.7, 0.5), 5.0)
    d = pol.schedule(view(5.0))
    by_id = {x.request.id: x.best_effort for x in d.dispatch}
    assert by_id == {"fresh": False, "late": True}  # never dropped, and marked
    assert [x.request.id for x in d.dispatch] == ["fresh", "late"]


def test_hfx_best_effort_idle_waits_for_an_instance_without_feasible_work_in_flight():
    pol = make_policy("hfx", best_effort="idle")
    pol.enqueue(req("fresh", 5.0, 100, 0.7, 0.5), 5.0)
    pol.enqueue(req("late", 0.0, 100, 0.7, 0.5), 5.0)  # arrived 5 s ago: TTFT lost
    d = pol.schedule(view(5.0, n=2))
    # Q_R is empty once "fresh" goes, but its instance now has it in flight: "late" waits for
    # the other, idle one (the default, "drained", would send it along with "fresh").
    assert [(x.request.id, x.instance, x.best_effort) for x in d.dispatch] == [
        ("fresh", 0, False), ("late", 1, True)]
    # Later hopeless ones may join the instance that runs only hopeless work, not the other.
    pol.enqueue(req("later", 1.0, 100, 0.7, 0.5), 6.0)
    pol.maturity.set(0, 6.0)
    pol.maturity.set(1, 6.0)
    assert [(x.request.id, x.instance) for x in pol.schedule(view(6.0, n=2)).dispatch] == [
        ("later", 1)]
    pol = make_policy("hfx", best_effort="idle")
    pol.enqueue(req("fresh", 5.0, 100, 0.7, 0.5), 5.0)
    pol.enqueue(req("late", 0.0, 100, 0.7, 0.5), 5.0)
    assert [x.request.id for x in pol.schedule(view(5.0)).dispatch] == ["fresh"]
    assert pol.schedule(view(6.0)).dispatch == [] and pol.num_queued() == 1  # still busy
    with pytest.raises(ValueError, match="best_effort"):
        make_policy("hfx", best_effort="never")


def test_prefill_demand_is_the_windowed_prefill_share_and_bounds_the_keepable_tpot():
    demand = PrefillDemand(window=10.0)
    demand.add(0.0, 2.0)
    demand.add(5.0, 4.0)
    # 6 s of prefill over the 5 s since the first arrival, on 2 instances.
    assert demand.share(5.0, 2) == pytest.approx(0.6)
    # 12 s on: the first arrival left the window; 4 s over 10 s, on 1 instance.
    assert demand.share(12.0, 1) == pytest.approx(0.4)
    assert demand.share(30.0, 1) == 0.0
    # Algorithm 1's payback leaves a share 1 − E_d / T for prefills: the tightest T it keeps.
    assert guard_floor(0.014, 0.3) == pytest.approx(0.02)
    assert guard_floor(0.014, 1.0) == math.inf


def test_hfx_keepable_guard_leaves_a_tpot_its_payback_cannot_keep_out_of_the_guard():
    loose, strict = req("loose", 0.0, 100, 5.0, 0.5), req("strict", 0.0, 100, 5.0, 0.05)
    for guard, kept in (("all", True), ("keepable", False)):
        pol = make_policy("hfx", guard_tpots=guard)
        assert isinstance(pol, HFXDispatcher)
        pol._share = 0.5  # the fleet's prompts take half of each instance's time
        sh = ShadowInstance(0, 10**6, 256)
        assert pol.guards(strict, sh, MODEL)  # nothing kept there yet: the first one is
        sh.add(loose, 10.0)
        # E_d = 0.03 + 1e-4 with one running: the payback keeps T >= E_d / (1 − 0.5) = 0.0602.
        assert pol.guards(strict, sh, MODEL) is kept
        assert pol.guards(req("mid", 0.0, 100, 5.0, 0.07), sh, MODEL)
        e_d = pol.decode_step(sh, MODEL)
        pol.enqueue(strict, 0.0)
        # Eq. 5 counts the queued strict class only where it is kept.
        assert pol.budget(sh, MODEL, e_d) == pytest.approx(
            token_budget(5.0, 0.05 if kept else 0.5, e_d, 0.02, 1e-4))
        sh.add(strict, 10.0, pol.guards(strict, sh, MODEL))
        assert sh.min_tpot() == (0.05 if kept else 0.5)
        assert sh.remove("strict", 110) and sh.min_tpot() == 0.5


@pytest.mark.parametrize("guard", ["all", "keepable"])
def test_hfx_keepable_guard_sends_a_strict_request_unguarded_beside_the_fleets_prompts(guard):
    pol = make_policy("hfx", guard_tpots=guard)
    # Five 1,000-token prompts at 0: 0.5 s of prefill (b = 1e-4) for one instance in its first
    # second, a share of 0.5; all go at once, the first kept as nothing is yet.
    for i in range(5):
        pol.enqueue(req(f"loose{i}", 0.0, 1000, 5.0, 0.5), 0.0)
    d = pol.schedule(view(0.0))
    assert len(d.dispatch) == 5
    assert pol.shadow[0].min_tpot() == 0.5
    # At the maturity a strict request arrives: E_d = 0.03 + 5e-4 with five running, so the
    # payback keeps T >= E_d / (1 - 0.51) = 0.062; its 0.05 is not kept there.
    now = pol.maturity[0]
    pol.enqueue(req("strict", now, 100, 5.0, 0.05), now)
    d = pol.schedule(view(now))
    assert [x.request.id for x in d.dispatch] == ["strict"]
    kept = guard == "all"
    assert pol.shadow[0].min_tpot() == (0.05 if kept else 0.5)
    # Algorithm 1's payback after it counts against the target kept.
    e_p, e_d = MODEL.prefill_time(100, 100 * 100), 0.03 + 6e-4
    assert pol.maturity[0] == pytest.approx(maturity_time(now, e_p, e_d, 0.05 if kept else 0.5))


def test_hfx_idle_instance_takes_work_beyond_the_budget():
    pol = make_policy("hfx")
    pol.enqueue(req("huge", 0.0, 9000, 0.7, 0.5), 0.0)  # more than Eq. 5 allows
    d = pol.schedule(view(0.0))
    assert [x.request.id for x in d.dispatch] == ["huge"]


def stepped_view(now: float, busy: float, steps: int, mixed: bool) -> ClusterView:
    """One instance that has run ``steps`` steps in ``busy`` seconds."""
    stats = InstanceStats(0, Role.COLOCATED, now, 0, 1, 0, 7, 0, 6250, 16, 100, 256, busy, steps)
    return ClusterView(now, [InstanceView(0, Role.COLOCATED, stats)], MODEL, PROFILE,
                       mixed_steps=mixed)


@pytest.mark.parametrize("mixed", [False, True])
def test_hfx_predicts_the_first_token_on_the_engine_it_dispatches_to(mixed: bool):
    pol = make_policy("hfx")
    pol.enqueue(req("a", 0.0, 100, 0.7, 0.5), 0.0)
    assert [x.request.id for x in pol.schedule(stepped_view(0.0, 0.0, 0, mixed)).dispatch] == ["a"]
    pol.schedule(stepped_view(1.0, 0.0, 0, mixed))
    # Four steps in 1.2 s: a measured step of 0.3 s (Eq. 2 predicts 0.0301 for "a" alone).
    pol.enqueue(req("b", 1.5, 100, 0.7, 0.5), 1.5)  # due at 2.2
    d = pol.schedule(stepped_view(2.0, 1.2, 4, mixed))
    assert pol.shadow[0].step == pytest.approx(0.3)
    if not mixed:
        # Prefill-first: the first token ~0.03 s after a decode step (≤ 0.03 s) ends: in time.
        assert [x.request.id for x in d.dispatch] == ["b"]
    else:
        # Chunked prefill: after the rest of a 0.3 s step, then a step that also decodes "a":
        # 0.16 s of slack against up to 0.3 s of wait, p ≈ 0.55 < θ: it stays queued.
        assert d.dispatch == [] and pol.num_queued() == 1


@pytest.mark.parametrize("mixed", [False, True])
def test_hfx_counts_the_running_decodes_in_a_mixed_first_step(mixed: bool):
    model = StepTimeModel(0.02, 1e-4, 0.0, 0.03, 0.0, 1e-3)  # E_d = 0.03 + 1e-3·B
    stats = InstanceStats(0, Role.COLOCATED, 0.0, 0, 0, 0, 0, 0, 62_500, 16, 0, 1024, 0.0, 0)
    view = ClusterView(0.0, [InstanceView(0, Role.COLOCATED, stats)], model,
                       Profile("t", model, kv_capacity_tokens=1_000_000), mixed_steps=mixed)
    pol = make_policy("hfx")
    sh = pol.shadow.sync(view.instances[0])
    for i in range(100):  # E_d = 0.13; no step measured yet (the wait is E_d either way)
        sh.add(req(f"d{i}", 0.0, 10, 100.0, 1.0), 10)
    pol.enqueue(req("b", 0.0, 100, 0.23, 1.0), 0.0)  # E_p = 0.03
    d = pol.schedule(view)
    if not mixed:  # 0.23 − 0.03 − 0.13/2 of slack, σ ≈ 0.04: p ≈ 1
        assert [x.request.id for x in d.dispatch] == ["b"]
    else:  # its step also decodes the 100 (+0.11 s): p ≈ 0.75 < θ, it waits
        assert d.dispatch == [] and pol.num_queued() == 1


@pytest.mark.parametrize("prefill_wait", ["batch", "admitted"])
@pytest.mark.parametrize("step_tokens", [None, 256])
def test_hfx_counts_the_steps_an_engine_that_chunks_prompts_takes(step_tokens, prefill_wait):
    stats = InstanceStats(0, Role.COLOCATED, 0.0, 0, 0, 0, 0, 0, 6250, 16, 0, 256, 0.0, 0)
    view = ClusterView(0.0, [InstanceView(0, Role.COLOCATED, stats)], MODEL, PROFILE,
                       mixed_steps=True, step_tokens=step_tokens)
    pol = make_policy("hfx", prefill_wait=prefill_wait)
    pol.enqueue(req("long", 0.0, 1000, 20.0, 1.0), 0.0)
    assert [x.request.id for x in pol.schedule(view).dispatch] == ["long"]
    e_d = 0.0301  # Eq. 2 with "long" decoding
    # Whole: E_p = 0.02 + 1e-4·1000. In 255-token chunks beside its own decode: 4 steps, each
    # past the first adding the fixed 0.02 s (nothing ran beside it when it was planned).
    e_p = 0.12 if step_tokens is None else 0.12 + 3 * 0.02
    payback = e_p / (1.0 - e_d) * e_d
    if prefill_wait == "batch":  # Algorithm 1: after the whole prefill
        assert pol.maturity[0] == pytest.approx(e_p + payback)
    else:  # when its last prefill step starts: at once for one step, after 3 of 4
        steps = 1 if step_tokens is None else 4
        assert pol.maturity[0] == pytest.approx(e_p * (steps - 1) / steps + payback)


def test_hfx_sends_a_prompt_to_join_the_next_step_on_an_engine_that_admits_at_every_step():
    """A second request arriving while the first one's prefill runs: with ``prefill_wait``
    "admitted" it goes at once (it joins the engine's next step either way); with the seed's
    wait it is held until the first one's prefill is predicted done. Prefill-first engines
    hold it either way."""
    def second_held_until(prefill_wait: str, mixed: bool) -> float | None:
        stats = InstanceStats(0, Role.COLOCATED, 0.0, 0, 0, 0, 0, 0, 6250, 16, 0, 256, 0.0, 0)
        view = ClusterView(0.0, [InstanceView(0, Role.COLOCATED, stats)], MODEL, PROFILE,
                           mixed_steps=mixed)
        pol = make_policy("hfx", prefill_wait=prefill_wait)
        pol.enqueue(req("first", 0.0, 1000, 20.0, 1.0), 0.0)
        assert len(pol.schedule(view).dispatch) == 1
        view.now = 0.01
        pol.enqueue(req("second", 0.01, 100, 20.0, 1.0), 0.01)
        d = pol.schedule(view)
        return None if d.dispatch else d.wake_at

    assert second_held_until("admitted", mixed=True) is None
    # With a request left queued (one sequence: the second cannot join), Algorithm 1's wait.
    waits = []
    for prefill_wait in ("admitted", "batch"):
        stats = InstanceStats(0, Role.COLOCATED, 0.0, 0, 0, 0, 0, 0, 6250, 16, 0, 1, 0.0, 0)
        view = ClusterView(0.0, [InstanceView(0, Role.COLOCATED, stats)], MODEL, PROFILE,
                           mixed_steps=True)
        pol = make_policy("hfx", prefill_wait=prefill_wait, queue_order="arrival")
        pol.enqueue(req("first", 0.0, 1000, 20.0, 1.0), 0.0)
        pol.enqueue(req("left", 0.0, 100, 20.0, 1.0), 0.0)
        assert len(pol.schedule(view).dispatch) == 1 and pol.num_queued() == 1
        waits.append(pol.maturity[0])
    assert waits[0] == waits[1] > 0.12
    held = second_held_until("batch", mixed=True)
    assert held is not None and held > 0.12  # the first one's E_p
    assert second_held_until("admitted", mixed=False) == second_held_until("batch", mixed=False)
    assert second_held_until("admitted", mixed=False) is not None


def test_hfx_on_vllms_scheduler_holds_what_its_steps_cannot_take():
    """Past vLLM's prefill throughput (four-task, 2 instances), HFX sends each instance what
    its 2,048-token steps take and keeps the rest, where a request whose TTFT is lost goes
    best effort; counting a batch's prefill as one step, it queued everything in vLLM, where
    wikisql (the loosest TPOT, the lowest priority, 76% of the prompt tokens) all waited and
    missed alike."""
    r = simulate(SimConfig(workload="four-task", instances=2, max_num_seqs=1024, policy="hfx",
                           planner="vllm", qps=155, duration=40, warmup=10))
    wikisql = r["per_task"]["wikisql"]
    assert wikisql["best_effort"] > 0
    assert wikisql["attainment"] > 0.5 and r["attainment"] > 0.85


def test_the_shadow_measures_the_engine_step_over_a_window():
    sh = ShadowInstance(0, 100_000, 256)
    def snap(busy: float, steps: int) -> InstanceStats:
        return InstanceStats(0, Role.COLOCATED, 0.0, 0, 0, 0, 0, 0, 6250, 16, 0, 256, busy, steps)
    sh.correct(snap(1.0, 10))  # the anchor
    sh.correct(snap(1.5, 13))  # three steps: too few to measure
    assert sh.step == 0.0
    sh.correct(snap(2.2, 14))  # four steps in 1.2 s
    assert sh.step == pytest.approx(0.3)
    sh.correct(snap(0.1, 1))  # a restarted engine: a new anchor, the last measure kept
    sh.correct(snap(0.5, 5))
    assert sh.step == pytest.approx(0.1)


def kv_view(now: float, used_blocks: list[int]) -> ClusterView:
    """Idle instances whose KV holds ``used_blocks`` of 6,250 blocks of 16 tokens."""
    stats = [InstanceStats(i, Role.COLOCATED, now, 0, 0, 0, u, 0, 6250, 16, 0, 256, 0.0, 0)
             for i, u in enumerate(used_blocks)]
    return ClusterView(now, [InstanceView(i, Role.COLOCATED, s) for i, s in enumerate(stats)],
                       MODEL, PROFILE)


def test_scorpio_round_robins_at_arrival_and_its_ttft_guard_rejects():
    pol = make_policy("scorpio")
    for i in range(4):
        pol.enqueue(req(f"r{i}", 0.0, 100, 0.7, 0.5), 0.0)
    # Its deadline-ordered prefill alone (0.02 + 1e-4·9000 = 0.92 s) misses its 0.5 s TTFT.
    pol.enqueue(req("long", 0.0, 9000, 0.5, 0.5), 0.0)
    d = pol.schedule(view(0.0, n=2))
    assert [(x.request.id, x.instance) for x in d.dispatch] == [
        ("r0", 0), ("r2", 0), ("r1", 1), ("r3", 1)]
    assert [r.id for r in d.reject] == ["long"]


def test_aladdin_places_by_best_fit_among_feasible_workers():
    pol = make_policy("aladdin")
    pol.enqueue(req("small", 0.0, 1000, 5.0, 0.5), 0.0)
    pol.enqueue(req("large", 0.0, 30_000, 5.0, 0.5), 0.0)  # more than worker 0 has free
    # Worker 0 has 1,250 blocks (20,000 tokens) free, worker 1 all 100,000.
    d = pol.schedule(kv_view(0.0, [5000, 0]))
    assert [(x.request.id, x.instance, x.best_effort) for x in d.dispatch] == [
        ("small", 0, False), ("large", 1, False)]


@pytest.mark.parametrize(("ttft", "tpot", "best_effort"), [
    (0.1201, 0.02165, False),  # just inside both bounds
    (0.1199, 0.02165, True),  # TTFT: the prefill alone takes 0.02 + 1e-4·1000 = 0.12 s
    (0.1201, 0.02163, True),  # TPOT: mean step 0.01 + 1e-5·(1000 + 128/2) + 1e-3 = 0.02164 s
])
def test_aladdin_feasibility_predicts_ttft_and_mean_tpot(ttft, tpot, best_effort):
    pol = make_policy("aladdin")
    pol.enqueue(req("r", 0.0, 1000, ttft, tpot), 0.0)  # output predicted: the 128-token prior
    view = kv_view(0.0, [0])
    view.step_model = PD_MODEL
    d = pol.schedule(view)
    assert [(x.request.id, x.best_effort) for x in d.dispatch] == [("r", best_effort)]


def test_aladdin_keeps_the_tightest_tpot_already_running_on_a_worker():
    pol = make_policy("aladdin")
    view = kv_view(0.0, [1000, 0])  # worker 0 the fuller: best fit's pick
    view.step_model = PD_MODEL
    pol.schedule(view)
    # Worker 0 runs a 30 ms request: ~22 ms a step alone, ~33 ms with a second 1,000-token one.
    pol.shadow[0].add(req("tight", 0.0, 1000, 5.0, 0.03), 128.0)
    pol.enqueue(req("loose", 0.0, 1000, 5.0, 0.5), 0.0)
    d = pol.schedule(view)
    assert [(x.request.id, x.instance, x.best_effort) for x in d.dispatch] == [
        ("loose", 1, False)]


def test_sa_assigns_each_request_to_the_largest_remaining_memory():
    pol = make_policy("sa")
    for rid, prompt in (("big", 3000), ("a", 100), ("b", 100)):
        pol.enqueue(req(rid, 0.0, prompt, 5.0, 0.5), 0.0)
    d = pol.schedule(view(0.0, n=2))
    placed = {x.request.id: x.instance for x in d.dispatch}
    placed |= {r.id: iid for iid, pending in pol._pending.items() for r, _ in pending}
    # big → 0 (a tie, lowest id); a → 1; b → 1, which still has more left than 0.
    assert placed == {"big": 0, "a": 1, "b": 1}


def test_sa_runs_no_search_while_the_instance_is_full_and_then_the_one_it_drew():
    pol = make_policy("sa")
    pol.schedule(view(0.0))  # the instance's shadow, then filled to its 256 sequences
    running = [req(f"x{i}", 0.0, 10, 5.0, 0.5) for i in range(256)]
    for r in running:
        pol.shadow[0].add(r, 10.0)
    for i in range(3):
        pol.enqueue(req(f"r{i}", 0.0, 100 * (3 - i), 5.0, 0.5), 0.0)
    assert pol.schedule(view(0.0)).dispatch == []
    drawn = pol._plans[0]
    # Drawn, with its seed and its inputs as of this call, but not run: no plan yet.
    assert isinstance(drawn, sa_module._Search)
    assert [j.prompt_len for j in drawn.jobs] == [300, 200, 100]
    assert pol.schedule(view(0.5)).dispatch == []
    assert pol._plans[0] is drawn  # still full, nothing new: the same search, still unrun
    expected = drawn.run(pol.max_batch, pol.params)
    for r in running:
        pol.shadow[0].remove(r.id, 20)
    d = pol.schedule(view(1.0))  # slots free: the search drawn at 0 s runs now
    assert [x.request.id for x in d.dispatch] == [f"r{j}" for j in expected.order[:3]]


# ---- HFX in P/D (HyperFlexis §5.1) ---------------------------------------------------------------


def decode_view(free_blocks: int = 6250) -> ClusterView:
    stats = InstanceStats(0, Role.DECODE, 0.0, 0, 0, 0, 6250 - free_blocks, 0, 6250, 16, 0, 256,
                          0.0, 0)
    return ClusterView(0.0, [InstanceView(0, Role.DECODE, stats)], PD_MODEL,
                       Profile("t", PD_MODEL, kv_capacity_tokens=100_000))


def test_hfx_migrator_admits_while_the_decode_step_keeps_the_strictest_tpot():
    _, migrator = make_pd_policies("hfx")
    for i in range(5):
        migrator.enqueue(req(f"r{i}", 0.0, 1000, 5.0, 0.05), 0.0)
    d = migrator.schedule(decode_view())
    # With k joined (1001 tokens of context each): E_d = 0.01 + 1e-5·1001·k + 1e-3·k:
    # 0.021, 0.032, 0.043 ≤ 0.05, then 0.054 > 0.05 — three go, two wait.
    assert [x.request.id for x in d.dispatch] == ["r0", "r1", "r2"]
    e_d = 0.01 + 1e-5 * 3003 + 3e-3
    assert migrator.maturity[0] == pytest.approx(e_d)  # the end of the next iteration
    assert d.wake_at == pytest.approx(e_d) and migrator.num_queued() == 2


def test_hfx_migrator_takes_the_strict_tpot_first_and_holds_the_batch_to_it():
    _, migrator = make_pd_policies("hfx")
    migrator.enqueue(req("loose", 0.0, 1000, 5.0, 0.05), 0.0)
    migrator.enqueue(req("strict", 0.0, 1000, 5.0, 0.03), 0.0)
    d = migrator.schedule(decode_view())
    # strict alone: 0.021 ≤ 0.03; with loose joined 0.032 > 0.03 (strict's TPOT binds).
    assert [x.request.id for x in d.dispatch] == ["strict"]


def test_hfx_migrator_binds_the_rest_of_the_batch_to_a_newly_admitted_strict_tpot():
    _, migrator = make_pd_policies("hfx")
    migrator.enqueue(req("first", 0.0, 1000, 5.0, 0.05), 0.0)
    migrator.schedule(decode_view())  # in flight: TPOT 0.05, about 1,000 tokens of context
    migrator.enqueue(req("strict", 0.0, 10, 5.0, 0.03), 0.0)
    migrator.enqueue(req("loose", 0.0, 1000, 5.0, 0.05), 0.0)
    view = decode_view()
    view.now = migrator.maturity[0]
    d = migrator.schedule(view)
    # strict joins (E_d ≈ 0.022 ≤ 0.03); loose would make E_d ≈ 0.033: within its own 0.05
    # and the in-flight 0.05, but not within strict's 0.03, which now binds.
    assert [x.request.id for x in d.dispatch] == ["strict"]


def test_hfx_migrator_never_admits_past_the_free_kv():
    _, migrator = make_pd_policies("hfx")
    for i in range(3):
        migrator.enqueue(req(f"r{i}", 0.0, 1000, 5.0, 1.0), 0.0)
    # 150 blocks = 2,400 tokens: one request needs 1,000 + 128 (the output prior).
    d = migrator.schedule(decode_view(free_blocks=150))
    assert [x.request.id for x in d.dispatch] == ["r0", "r1"]


def test_hfx_prefill_budget_is_the_tokens_whose_prefill_fits_the_strictest_ttft():
    from hfx.policies.shadow import ShadowInstance

    dispatcher, _ = make_pd_policies("hfx")
    sh = ShadowInstance(0, 10**6, 256)  # what is in flight does not enter the P stage's budget
    assert dispatcher.budget(sh, PD_MODEL, 0.0) == float("inf")  # nothing queued
    dispatcher.enqueue(req("a", 0.0, 100, 2.0, 0.1), 0.0)
    dispatcher.enqueue(req("b", 0.0, 100, 0.5, 0.1), 0.0)
    assert dispatcher.budget(sh, PD_MODEL, 0.0) == pytest.approx((0.5 - 0.02) / 1e-4)


def test_hfx_stages_override_by_default_colocated_and_not_on_a_prefill_stage():
    dispatcher, _ = make_pd_policies("hfx")
    assert make_policy("hfx").override and not dispatcher.override
    assert make_pd_policies("hfx", override="on")[0].override
    assert not make_policy("hfx", override="off").override


# ---- SCORPIO ---------------------------------------------------------------------------------
def test_scorpio_predicted_tpot_on_a_hand_example():
    from hfx.policies.shadow import ShadowInstance

    pol = make_policy("scorpio", epsilon=1.5)
    sh = ShadowInstance(0, 10**6, 256)  # a real one: compiled, predicted_tpot takes no other
    for rid in ("x", "y"):  # a batch of 2 holding 2,000 tokens of context
        sh.add(req(rid, 0.0, 1000, 1.0, 0.1), 10.0)
    r = req("r", 0.0, 500, 1.0, 0.05)
    # n_real = 3; context 2000 + 500 + 3·100/2 = 2650, L_avg = 2650/3; the virtual batch size
    # with TPOTs 0.1, 0.2 and 0.05 is 0.5 + 0.25 + 1 = 1.75; ε·(α·n·L_avg + β·n + δ).
    got = pol.predicted_tpot(sh, TPOTMix(0.1, 1 / 0.1 + 1 / 0.2), r, 100.0, alpha=1e-5,
                             beta=2e-3, delta=0.03)
    assert got == pytest.approx(1.5 * (1e-5 * 1.75 * 2650 / 3 + 2e-3 * 1.75 + 0.03))


def test_scorpio_deadline_queue_guards_as_a_sorted_walk_does():
    """The queue against the walk it replaced: sort by (deadline, arrival, seq), reject each
    request whose prefill, after those kept before it, ends past its deadline; then the time of
    the next rejection. Random pushes, guards, admissions and withdrawals; ties in deadline."""
    rng = random.Random(7)
    queue, ref, seq_no, num_rejected = DeadlineQueue(), [], 0, 0
    for step in range(600):
        now = step / 64  # binary fractions: deadlines tie exactly, arrivals then decide
        for _ in range(rng.randrange(3)):
            seq_no += 1
            arrival = now - rng.choice((0.0, 0.5))
            item = (arrival + rng.choice((0.5, 1.0, 2.0)), arrival, seq_no,
                    rng.uniform(0.01, 0.2), req(f"r{seq_no}", arrival, 100, 1.0, 0.1))
            queue.push(*item)
            ref.append(item)
        ref.sort()
        kept, rejected, cum = [], [], 0.0
        for item in ref:
            if now + cum + item[3] > item[0]:
                rejected.append(item[4].id)
            else:
                cum += item[3]
                kept.append(item)
        assert [r.id for r in queue.guard(now)] == rejected
        num_rejected += len(rejected)
        ref = kept
        taken = sorted(rng.sample(range(len(ref)), min(len(ref), rng.randrange(3))))
        if rng.random() < 0.5:
            taken = list(range(min(len(ref), rng.randrange(3))))  # a prefix, as most are
        queue.remove(taken)
        ref = [item for k, item in enumerate(ref) if k not in taken]
        if ref and rng.random() < 0.1:
            gone = ref.pop(rng.randrange(len(ref)))[4].id
            assert queue.withdraw(gone)
        assert not queue.withdraw("nobody")
        assert [r.id for r in queue.requests()] == [item[4].id for item in ref]
        cum, at = 0.0, math.inf
        for item in ref:
            cum += item[3]
            at = min(at, item[0] - cum)
        assert queue.reject_at() == at and len(queue) == len(ref)
    assert seq_no > 500 and num_rejected > 50 and DeadlineQueue().reject_at() == math.inf


def test_virtual_batch_size_is_sum_of_trp():
    assert TPOTMix().virtual_batch_with(1.0) == 1.0  # alone
    running = TPOTMix()
    for t in (0.25, 0.5):
        running.add(t)
    assert running.virtual_batch_with(1.0) == pytest.approx(1 + 0.5 + 0.25)
    running = TPOTMix()
    for t in (0.5, 1.0):
        running.add(t)
    assert running.virtual_batch_with(0.25) == pytest.approx(1 + 0.5 + 0.25)  # new tightest


def test_credit_rule_decodes_in_proportion_to_tpot(vloop):
    engine, ex = make_engine(planner="credit")
    for rid, tpot in (("a", 0.5), ("b", 1.0), ("c", 0.25)):
        engine.add_request(seq(rid, 4, 50, tpot=tpot))

    async def steps(n):
        for _ in range(n):
            await engine.step()

    vloop.run_until_complete(steps(5))  # one prefill step, then four decode steps
    assert ex.plans[0] == {"a": 4, "b": 4, "c": 4}
    # TRP: c 1, a 0.5, b 0.25. Credits: c decodes every step, a every other, b every fourth.
    assert ex.plans[1:] == [{"c": 1}, {"a": 1, "c": 1}, {"c": 1}, {"a": 1, "b": 1, "c": 1}]


def test_credit_preempts_the_newest_due_sequence_and_keeps_the_others_in_order(vloop):
    """Out of KV, a credit step preempts the most recently admitted of the sequences due in
    it (vLLM's victim), and a sequence that skips the step keeps its place in the running
    list: the admission order decides the next victims."""
    engine, ex = make_engine(num_blocks=5, planner="credit")  # 4 prompts of a block each
    for rid, tpot in (("a", 0.25), ("b", 0.5), ("c", 0.25), ("d", 0.25)):
        engine.add_request(seq(rid, 4, 12, tpot=tpot))
    running = []

    async def steps(n):
        for _ in range(n):
            await engine.step()
            running.append([s.request_id for s in engine.state.running])

    vloop.run_until_complete(steps(3))
    # Step 1: a, c and d are due (b every other step); a takes the last free block, c needs
    # one, so d, the newest due, goes; b stays between a and c.
    assert ex.plans[1] == {"a": 1, "c": 1} and running[1] == ["a", "b", "c"]
    # Step 2: b is due too and needs a block: c, now the newest due, goes.
    assert ex.plans[2] == {"a": 1, "b": 1} and running[2] == ["a", "b"]
    assert [s.request_id for s in engine.state.waiting] == ["c", "d"]


# ---- SA --------------------------------------------------------------------------------------
def test_sa_moves_on_a_hand_example():
    order, sizes = [0, 1, 2, 3, 4], [2, 2, 1]
    assert squeeze(order, sizes, 2, 3) == ([0, 1, 2, 3, 4], [3, 1, 1])
    assert squeeze(order, sizes, 3, 3) == ([0, 1, 3, 2, 4], [3, 1, 1])
    assert squeeze(order, sizes, 0, 3) is None  # already in the first batch
    assert squeeze(order, [3, 2], 3, 3) is None  # previous batch full
    assert delay(order, sizes, 0, 3) == ([1, 0, 2, 3, 4], [1, 3, 1])
    assert delay(order, sizes, 3, 3) == ([0, 1, 2, 3, 4], [2, 1, 2])
    assert delay(order, sizes, 4, 3) is None  # alone in the last batch
    assert delay(order, [2, 3], 1, 3) is None  # next batch full
    assert delay(order, [2, 3], 4, 3) == ([0, 1, 2, 3, 4], [2, 2, 1])  # a new last batch
    assert swap(order, sizes, 0, 4) == ([4, 1, 2, 3, 0], [2, 2, 1])


def test_sa_objective_on_a_hand_example():
    model = StepTimeModel(0.0, 1e-3, 0.0, 0.01, 0.0, 0.0)
    jobs = [Job(100, 10, 0.0, 1.0, 0.05), Job(100, 10, 0.0, 1.0, 0.05)]
    # Together: prefill 0.2, E2E 0.2 + 10·0.01 = 0.3 each → 1 / 0.3.
    assert objective(jobs, [0, 1], [2], model) == pytest.approx(1 / 0.3)
    # Apart: E2E 0.2 and 0.1 + 0.1 + 0.1 = 0.3 → 1 / 0.25.
    assert objective(jobs, [0, 1], [1, 1], model) == pytest.approx(1 / 0.25)
    # A TTFT of 0.15 is met only by the first batch when apart.
    tight = [Job(100, 10, 0.0, 0.15, 0.05)] * 2
    assert evaluate(tight, [0, 1], [1, 1], model) == (pytest.approx(0.5 / 0.25), 1)


def test_sa_search_improves_on_its_starting_solutions():
    model = StepTimeModel(0.01, 1e-4, 0.0, 0.02, 0.0, 1e-4)
    rng = random.Random(3)
    jobs = [Job(rng.randint(200, 1500), rng.randint(10, 60), rng.random() * 0.4,
                rng.choice([0.5, 0.7, 5.0]), 0.5) for _ in range(12)]
    start = max(objective(jobs, list(range(12)), [4, 4, 4], model), 0.0)
    plan = anneal(jobs, model, 4, 0, t0=100, t_min=20, iterations=30)
    assert sorted(plan.order) == list(range(12)) and sum(plan.sizes) == 12
    assert all(1 <= s <= 4 for s in plan.sizes)
    assert plan.score == pytest.approx(objective(jobs, plan.order, plan.sizes, model))
    assert plan.score > start


def test_sa_search_compiled_equals_its_python_source():
    """numba compiles the search; the plan must be the one its source computes as Python."""
    from hfx.policies import sa_search

    if not hasattr(sa_search._anneal, "py_func"):
        pytest.skip("numba is not installed: the search runs as Python already")
    model = StepTimeModel(0.01, 1e-4, 1e-8, 0.02, 1e-6, 1e-4)
    rng = random.Random(5)
    jobs = [Job(rng.randint(200, 1500), rng.randint(10, 60), rng.random() * 0.4,
                rng.choice([0.5, 0.7]), rng.choice([0.05, 0.5])) for _ in range(14)]
    arr, coef = sa_search._jobs_array(jobs), sa_search._coef(model)
    order, sizes = sa_search._arrays(list(range(14)), [4, 4, 4, 2])
    score = sa_search._evaluate(arr, order, sizes, 4, coef, 500.0, 3)[0]
    args = (arr, coef, 500.0, 3, 4, 12345, 100.0, 20.0, 30, 0.9, order, sizes, 4, score)
    compiled = sa_search._anneal(*args)
    python = sa_search._anneal.py_func(*args)
    assert compiled[0].tolist() == python[0].tolist()
    assert compiled[1].tolist() == python[1].tolist()
    assert compiled[2] == python[2] > score


# ---- tier-split (a reference split by TPOT tier) ----------------------------------------------
def test_split_fleet_sizes_polyserves_tiers_by_the_time_each_pace_leaves():
    """PolyServe §5.1's tiers (10/20/30/40% at 20/30/50/100 ms) on a 7.2 ms fixed step: shares
    over 1 − a/τ are 0.156, 0.263, 0.350, 0.431, so 20 instances are 2.60, 4.38, 5.83 and
    7.18: floors, then the largest remainders (0.83 and 0.60)."""
    from hfx.policies.tier_split import largest_remainder, split_fleet

    tiers, shares = [0.02, 0.03, 0.05, 0.1], [0.1, 0.2, 0.3, 0.4]
    assert split_fleet(20, shares, tiers, 0.0072) == [3, 4, 6, 7]
    assert split_fleet(8, shares, tiers, 0.0072) == [1, 2, 2, 3]
    assert largest_remainder([1.0, 3.0], 2) == [1, 1]  # 0.5 and 1.5, but one each
    assert largest_remainder([1.0, 1.0, 30.0], 4) == [1, 1, 2]
    assert largest_remainder([1.0, 3.0], 1) == [1, 0]  # too few: the strictest first
    with pytest.raises(ValueError, match="leaves nothing"):
        split_fleet(20, [1.0], [0.005], 0.0072)


def test_tier_split_sends_each_tpot_to_the_loosest_part_that_keeps_it():
    """Parts 0.02 s (instance 0) and 0.1 s (instances 1–3): a 20 ms request goes to instance 0
    however loaded; 50 ms and 10 ms ones too (the 0.1 s part is too slow for them); a 100 ms
    and a 300 ms one to the least-loaded of 1–3 (each placement counted for the next)."""
    pol = make_policy("tier-split", tpots="0.02/0.1", groups="1/3")
    v = view(0.0, n=4)
    for inst, tokens in zip(v.instances, (10_000, 500, 0, 50), strict=True):
        inst.outstanding_tokens = tokens
    for rid, tpot in (("t20", 0.02), ("t50", 0.05), ("t10", 0.01), ("t100", 0.1),
                      ("t300", 0.3)):
        pol.enqueue(req(rid, 0.0, 100, 1.0, tpot), 0.0)
    d = pol.schedule(v)
    # t100 goes to instance 2 (0 tokens) and counts 110 there: t300 then to 3 (50 tokens).
    assert [(x.request.id, x.instance) for x in d.dispatch] == [
        ("t20", 0), ("t50", 0), ("t10", 0), ("t100", 2), ("t300", 3)]


def test_tier_split_rescales_its_parts_to_the_fleet_it_finds():
    """Groups of 1 and 3 on a fleet of 2 (two instances gone): a part each; none: one part."""
    pol = make_policy("tier-split", tpots="0.02/0.1", groups="1/3")
    assert [[i.id for i in part] for part in pol.parts(view(0.0, n=2).instances)] == [[0], [1]]
    assert [[i.id for i in part] for part in pol.parts(view(0.0, n=5).instances)] == [
        [0], [1, 2, 3, 4]]
    plain = make_policy("tier-split")
    assert [[i.id for i in part] for part in plain.parts(view(0.0, n=3).instances)] == [
        [0, 1, 2]]


@pytest.mark.parametrize(("params", "message"), [
    ({"tpots": "0.02/0.1", "groups": 3.0}, "2 TPOT targets but 1 group sizes"),
    ({"tpots": "0.1/0.02", "groups": "1/1"}, "strictly increasing"),
    ({"tpots": 0.02, "groups": 1.5}, "whole number"),
    ({"tpots": "0.02,0.1", "groups": "1/1"}, "separated by '/'"),
])
def test_tier_split_bad_parameters_are_clear(params, message):
    with pytest.raises(ValueError, match=message):
        make_policy("tier-split", **params)


# ---- shared pieces and end to end ------------------------------------------------------------
def test_output_length_predictor_history_and_oracle():
    p = OutputLengthPredictor("history", prior=100, min_samples=2)
    r = Request("x", 0, 10, 77, SLO(1, 1), task="chat")
    assert p.predict(r) == 100
    p.observe("code", 10)
    p.observe("code", 30)
    assert p.predict(r) == 20  # another task's mean until this one has samples
    for n in (40, 60):
        p.observe("chat", n)
    assert p.predict(r) == 50
    assert OutputLengthPredictor("oracle").predict(r) == 77
    with pytest.raises(ValueError):
        OutputLengthPredictor("psychic")


def test_policy_bad_parameters_are_clear():
    with pytest.raises(ValueError, match="hfx"):
        make_policy("hfx", nonsense=1)
    with pytest.raises(ValueError, match="theta"):
        make_policy("hfx", theta=2)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_serves_every_request(policy):
    params = {"t0": 100.0, "iterations": 10} if policy == "sa" else {}
    r = simulate(SimConfig(policy=policy, qps=120, requests_per_task=30, policy_params=params))
    assert r["requests"] == 120
    assert r["finished"] + r["rejected"] == 120  # SCORPIO may reject; nobody loses a request
    assert r["failed"] == 0 and r["attainment"] > 0.3


def test_record_is_finished_once_per_request():
    rec = RequestRecord(Request("a", 0, 5, 5, SLO(1, 1)))
    assert rec.outcome is Outcome.PENDING


def test_tally_counts_targets_and_a_target_that_leaves_comes_back_last():
    """Σ n/target sums in the order the targets came (a float sum's order is its result), as
    the Counter it replaced did: a target whose count falls to 0 leaves and returns last."""
    from hfx.tally import Tally

    t = Tally()
    assert t.tightest() is None and t.inverse_sum() == 0.0 and len(t) == 0
    for target in (0.01, 0.02, 0.01, 0.7):
        t.add(target)
    assert t.tightest() == 0.01 and len(t) == 3
    assert t.inverse_sum() == 2 / 0.01 + 1 / 0.02 + 1 / 0.7
    t.discard(0.01)
    assert t.tightest() == 0.01  # one request of 0.01 is left
    t.discard(0.01)
    assert t.tightest() == 0.02 and len(t) == 2
    t.add(0.01)  # back, now after 0.02 and 0.7: the sum differs in its last bit
    assert 1 / 0.02 + 1 / 0.7 + 1 / 0.01 != 1 / 0.01 + 1 / 0.02 + 1 / 0.7
    assert t.inverse_sum() == 1 / 0.02 + 1 / 0.7 + 1 / 0.01
    with pytest.raises(KeyError):
        t.discard(0.5)  # never added
    t.discard(0.01)
    assert t.tightest() == 0.02
    t.discard(0.02)
    t.discard(0.7)
    assert t.tightest() is None and len(t) == 0


def test_maturity_queue_serves_each_mature_member_once_per_call_earliest_first():
    from hfx.policies.maturity import MaturityQueue

    q = MaturityQueue()
    q.members([0, 1, 2, 3], now=0.0)  # all mature at 0
    q.set(2, 5.0)
    q.set(2, 0.5)  # supersedes 5.0
    q.set(3, 9.0)
    order = []
    while (iid := q.pop_mature(1.0)) is not None:
        order.append(iid)
        q.set(iid, 1.0)  # served: mature again at once, but not twice in one round
    assert order == [0, 1, 2]  # (time, id) order; 3 is not mature
    q.end_round()
    # The next round sees the entries set during this one, in (time, id) order.
    order = []
    while (iid := q.pop_mature(1.0)) is not None:
        order.append(iid)
        q.set(iid, 1.0 + iid)
    assert order == [0, 1, 2]
    assert q.earliest() == 1.0  # ends the round too
    assert q.pop_mature(1.0) == 0
    q.set(0, 1.0)
    q.end_round()
    # A non-member is never served, and its times no longer count.
    q.members([1, 3], now=2.0)
    assert q.pop_mature(2.0) == 1
    q.set(1, 4.0)  # a served instance always gets its next maturity
    q.end_round()
    assert q.pop_mature(2.0) is None
    q.set(0, 0.0)
    assert q.earliest() == 4.0 and q.pop_mature(10.0) == 1


def test_maturity_queue_with_an_order_serves_the_least_ranked_mature_member_first():
    from hfx.policies.maturity import MaturityQueue

    q = MaturityQueue()
    q.members([0, 1, 2, 3], now=0.0)
    for iid, t in ((0, 0.1), (1, 0.2), (2, 0.3), (3, 5.0)):
        q.set(iid, t)
    load = {0: 3.0, 1: 1.0, 2: 1.0, 3: 0.0}
    order = []
    while (iid := q.pop_mature(1.0, load.__getitem__)) is not None:
        order.append(iid)
        q.set(iid, 0.0)  # served: mature again at once, but not twice in one round
    # 3 is the lightest but not mature; 1 and 2 tie, the earlier first; 0 last.
    assert order == [1, 2, 0]
    q.end_round()
    # Only the ``look`` earliest mature members are ranked.
    q.members([0, 1, 2], now=1.0)
    for iid, t in ((0, 0.1), (1, 0.2), (2, 0.3)):
        q.set(iid, t)
    assert q.pop_mature(1.0, {0: 2.0, 1: 1.0, 2: 0.0}.__getitem__, look=2) == 1


def test_hfx_serves_the_lightest_of_the_mature_instances_first():
    # Instance 0 mature since 0.0 and running 3 requests; instance 1 mature since 0.5, idle.
    def dispatched(order: str) -> list[int]:
        pol = make_policy("hfx", mature_order=order)
        v = view(1.0, n=2)
        pol.schedule(v)  # the shadows follow the view
        for k in range(3):
            pol.shadow[0].add(req(f"run{k}", 0.0, 100, 2.0, 0.5), 10.0)
        pol.maturity.set(1, 0.5)
        pol.maturity.set(0, 0.0)
        pol.enqueue(req("r", 1.0, 100, 2.0, 0.5), 1.0)
        return [x.instance for x in pol.schedule(v).dispatch]

    assert dispatched("lightest") == [1]
    assert dispatched("maturity") == [0]  # the seed's: mature longest


def test_maturity_queue_drops_superseded_entries_and_keeps_the_order():
    from hfx.policies.maturity import MaturityQueue

    q = MaturityQueue()
    q.members([0, 1, 2], now=0.0)
    for k in range(500):  # re-timed often: the heap is rebuilt, never grows past a bound
        q.set(k % 3, 10.0 - k / 100)
    assert len(q._heap) <= 4 * 3 + 64 + 1
    # The last times: 1 at 5.01, 0 at 5.02, 2 at 5.03.
    assert [q.pop_mature(6.0) for _ in range(4)] == [1, 0, 2, None]
    q.set(2, 1.0)  # served this round: aside until the round ends, even through a rebuild
    for k in range(200):
        q.set(0, 7.0 + k / 1000)
    q.set(1, 8.0)
    assert q.pop_mature(6.0) is None
    q.end_round()
    assert q.pop_mature(6.0) == 2 and q.earliest() == 7.199


def test_hfx_tpot_guard_off_drops_eq5_and_the_payback_wait():
    # 20 requests of TPOT 0.05 s decode on the instance (E_d = 0.03 + 1e-4·20 = 0.032 s) when
    # an 8000-token prompt arrives with TTFT 2 s: Eq. 5 allows (2·0.05 − 2·0.032 − 0.02·0.05) /
    # (1e-4·0.05) = 7,000 tokens, its prefill alone (0.82 s) keeps its TTFT.
    def run(guard: str):
        pol = make_policy("hfx", tpot_guard=guard, override="off")
        for i in range(20):
            pol.enqueue(req(f"run{i}", 0.0, 1000, 100.0, 0.05), 0.0)
        assert len(pol.schedule(view(0.0)).dispatch) == 20
        pol.enqueue(req("long", 10.0, 8000, 2.0, 0.5), 10.0)
        return pol, pol.schedule(view(10.0, running=20, ctx=20_000))

    pol, d = run("eq5")
    assert d.dispatch == [] and pol.num_queued() == 1  # the long prompt waits
    pol, d = run("off")
    assert [x.request.id for x in d.dispatch] == ["long"]
    # Mature one decode step (21 sequences now) after the prefill: no payback wait.
    assert pol.maturity[0] == pytest.approx(10.0 + MODEL.prefill_one(8000) + 0.03 + 21e-4)
    with pytest.raises(ValueError, match="tpot_guard"):
        make_policy("hfx", tpot_guard="sometimes")


def busy(now: float, waiting: int = 0) -> ClusterView:
    """One instance decoding 20 sequences of 1,000 tokens; ``waiting`` queued in its engine."""
    stats = InstanceStats(0, Role.COLOCATED, now, waiting, 20, 0, 1250, 0, 6250, 16, 20_000, 256,
                          0.0, 0)
    return ClusterView(now, [InstanceView(0, Role.COLOCATED, stats)], MODEL, PROFILE)


def held_by_the_guard(override: str, prompt: int = 8000, ttft: float = 6.0):
    """20 requests of TPOT 35 ms decode (E_d = 0.032 s: relax 3 ms, so the instance pays its
    2.02 s prefill back until t = 2.02 + 2.02 / 0.003 · 0.032 = 23.6 s) when an 8000-token
    prompt arrives at t = 10 with TTFT 6 s. Eq. 5 allows 6 · (0.035 − 0.032) / (1e-4 · 0.035)
    − 0.02 / 1e-4 = 4,943 tokens: the guard holds it past its deadline."""
    pol = make_policy("hfx", override=override)
    for i in range(20):
        pol.enqueue(req(f"run{i}", 0.0, 1000, 100.0, 0.035), 0.0)
    assert len(pol.schedule(view(0.0)).dispatch) == 20
    pol.enqueue(req("long", 10.0, prompt, ttft, 0.5), 10.0)
    return pol


def test_hfx_override_dispatches_a_request_the_guard_holds_once_it_is_urgent():
    pol = held_by_the_guard("on")
    d = pol.schedule(busy(10.0))
    # Urgent at 16 − 5 prefills of 0.82 s − 20 step floors of 0.03 s = 11.3 s: not yet, and the
    # dispatcher wakes then, long before the instance's maturity.
    assert d.dispatch == [] and d.wake_at == pytest.approx(11.3)
    assert pol.maturity[0] == pytest.approx(2.02 + 2.02 / 0.003 * 0.032)
    d = pol.schedule(busy(11.3))
    assert [(x.request.id, x.instance, x.best_effort) for x in d.dispatch] == [("long", 0, False)]
    # Seed's dispatcher: it waits (and goes best effort once its TTFT is lost).
    pol = held_by_the_guard("off")
    assert pol.schedule(busy(10.0)).wake_at == pytest.approx(2.02 + 2.02 / 0.003 * 0.032)
    assert pol.schedule(busy(11.3)).dispatch == []


def test_hfx_override_never_sends_to_an_engine_with_a_backlog():
    pol = held_by_the_guard("on")
    assert pol.schedule(busy(11.3, waiting=3)).dispatch == []
    assert pol.num_queued() == 1  # still queued: the normal scan may take it later


def two_alike(looser: int, **params: float) -> HFXDispatcher:
    """HFX over two instances decoding alike (E_d = 0.032 s, TTFT 1 s), the looser tightest TPOT
    on ``looser``: 36 ms leaves Eq. 5 room for 911 prompt tokens, 35 ms for 657. An
    8000-token prompt, TTFT 6 s, is queued at 10 s: it fits neither, and its first token is as
    likely in time on both (p = 1)."""
    pol = make_policy("hfx", **params)
    pol.schedule(view(0.0, n=2))
    for iid in (0, 1):
        tpot = 0.036 if iid == looser else 0.035
        for i in range(20):
            pol.shadow[iid].add(req(f"run{iid}.{i}", 0.0, 1000, 1.0, tpot), 10.0)
    pol.enqueue(req("long", 10.0, 8000, 6.0, 0.5), 10.0)
    return pol


@pytest.mark.parametrize("looser", [0, 1])
def test_hfx_override_sends_an_urgent_prompt_where_it_leaves_most_room(looser: int):
    # The order of the instances must not decide, or every urgent prompt goes to the same one.
    pol = two_alike(looser)
    assert pol.schedule(view(10.0, n=2, running=20, ctx=20_000)).dispatch == []
    d = pol.schedule(view(11.3, n=2, running=20, ctx=20_000))
    assert [(x.request.id, x.instance) for x in d.dispatch] == [("long", looser)]


@pytest.mark.parametrize("busy_one", [0, 1])
def test_hfx_override_sends_an_urgent_prompt_where_it_starts_soonest(busy_one: int):
    # The more room is on ``busy_one``, but a batch sent there is prefilled only at 11.5 s: the
    # prompt goes where it starts at once, not behind that batch.
    pol = two_alike(busy_one)
    pol._prefilled_at[busy_one] = 11.5
    d = pol.schedule(view(11.3, n=2, running=20, ctx=20_000))
    assert [(x.request.id, x.instance) for x in d.dispatch] == [("long", 1 - busy_one)]


@pytest.mark.parametrize("looser", [0, 1])
@pytest.mark.parametrize("ended, quiet_cap, goes_looser", [
    (11.1, 0.5, False),  # its last prefill ended 0.2 s ago: the quiet instance
    (10.5, 0.5, True),  # 0.8 s ago, both past the cap: the room decides
    (11.1, 0.0, True),  # a cap of 0: the tie-break off, the room decides (38ea47f's order)
])
def test_hfx_override_prefers_the_instance_quiet_longest_among_equal_starts(
        looser: int, ended: float, quiet_cap: float, goes_looser: bool):
    # Both start the prompt at 11.3 s. The looser one's last prefill ended at ``ended``: its
    # newest requests have banked little slack against a second 0.82 s prefill, so among equal
    # starts the other goes first, unless both have been quiet for the cap or longer.
    pol = two_alike(looser, quiet_cap=quiet_cap)
    pol._prefilled_at[looser] = ended
    d = pol.schedule(view(11.3, n=2, running=20, ctx=20_000))
    want = looser if goes_looser else 1 - looser
    assert [(x.request.id, x.instance) for x in d.dispatch] == [("long", want)]


def test_hfx_refuses_a_negative_quiet_cap():
    with pytest.raises(ValueError, match="quiet_cap"):
        make_policy("hfx", quiet_cap=-1.0)


def loaded_and_maturing(now: float) -> ClusterView:
    """Instance 0 decoding 20 sequences of 1,000 tokens, instance 1 idle."""
    stats = [InstanceStats(i, Role.COLOCATED, now, 0, r, 0, r * 1000 // 16, 0, 6250, 16,
                           r * 1000, 256, 0.0, 0) for i, r in ((0, 20), (1, 0))]
    return ClusterView(now, [InstanceView(i, Role.COLOCATED, s) for i, s in enumerate(stats)],
                       MODEL, PROFILE)


@pytest.mark.parametrize("ahead, matures", [(False, 12.0), (True, 12.0), (False, 15.1)])
def test_hfx_override_waits_for_an_instance_that_matures_in_time(ahead: bool, matures: float):
    # Instance 0 runs 20 requests of TPOT 35 ms, TTFT 1 s: Eq. 5 leaves it 657 tokens. Instance 1
    # is idle but prefilling until ``matures``. The 8000-token prompt (TTFT 6 s, deadline 16 s,
    # prefill 0.82 s) is urgent at 11.3 s. From 12 s it ends 3.18 s early on instance 1; from
    # 15.1 s 0.08 s early, in time but with p = Φ(0.08 / 0.082) = 0.84 < θ.
    pol = make_policy("hfx")
    pol.schedule(loaded_and_maturing(0.0))
    for i in range(20):
        pol.shadow[0].add(req(f"run{i}", 0.0, 1000, 1.0, 0.035), 10.0)
    pol.maturity.set(1, matures)
    if ahead:  # a stricter request, not urgent, heads Q_R's scan: instance 1 would take it first
        pol.enqueue(req("strict", 10.0, 8000, 60.0, 0.1), 10.0)
    pol.enqueue(req("long", 10.0, 8000, 6.0, 0.5), 10.0)
    assert pol.schedule(loaded_and_maturing(10.0)).dispatch == []
    d = pol.schedule(loaded_and_maturing(11.3))
    if ahead or matures > 12.0:
        # Behind another request, or unlikely in time there: it goes now, past instance 0's
        # budget.
        assert [(x.request.id, x.instance) for x in d.dispatch] == [("long", 0)]
        return
    # Not past the loaded instance's budget: it waits for instance 1's maturity, when it is
    # looked at again.
    assert d.dispatch == [] and pol.num_queued() == 1
    assert [(t, r.id) for t, _, r in pol._urgent] == [(12.0, "long")]
    d = pol.schedule(loaded_and_maturing(12.0))
    assert [(x.request.id, x.instance) for x in d.dispatch] == [("long", 1)]


def test_hfx_override_takes_what_the_maturity_wait_would_make_late():
    # 4000 tokens fit Eq. 5's 4,943: the payback wait (to 23.6 s), not the budget, holds it.
    # With TTFT 6 s (deadline 16 s) the wait ends too late: it goes once urgent.
    pol = held_by_the_guard("on", prompt=4000)
    urgent = 16.0 - 5 * MODEL.prefill_one(4000) - 20 * 0.03  # 13.3 s
    assert pol.schedule(busy(10.0)).wake_at == pytest.approx(urgent)
    assert [x.request.id for x in pol.schedule(busy(urgent)).dispatch] == ["long"]
    # With TTFT 15 s (deadline 25 s) it still starts in time at maturity (23.6 + 0.42 + 0.032
    # s): urgent at 22.3 s, it is left to the wait, which batches prefills (wikisql's knee).
    pol = held_by_the_guard("on", prompt=4000, ttft=15.0)
    urgent = 25.0 - 5 * MODEL.prefill_one(4000) - 20 * 0.03
    assert pol.schedule(busy(urgent)).dispatch == [] and pol.num_queued() == 1
    mature = 2.02 + 2.02 / 0.003 * 0.032
    assert [x.request.id for x in pol.schedule(busy(mature)).dispatch] == ["long"]


class FixedCache:
    """A prefix index whose answers the test sets: request id → {instance: cached tokens}."""

    def __init__(self, hits: dict[str, dict[int, int]]) -> None:
        self.hits = hits

    def match(self, request: Request) -> dict[int, int]:
        return self.hits.get(request.id, {})


def cache_view(now: float, n: int, hits: dict[str, dict[int, int]]) -> ClusterView:
    v = view(now, n)
    v.prefix = FixedCache(hits)
    return v


def test_hfx_waits_for_the_instance_that_has_the_prompt_cached_when_it_starts_in_time():
    pol = make_policy("hfx")
    pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
    # Both idle; instance 0 is served first, but 1 has 2,400 of the 2,500 tokens cached.
    d = pol.schedule(cache_view(0.0, 2, {"r": {1: 2400}}))
    assert [(x.request.id, x.instance) for x in d.dispatch] == [("r", 1)]
    # The same without the cache: the first instance served takes it.
    pol = make_policy("hfx")
    pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
    assert [x.instance for x in pol.schedule(view(0.0, 2)).dispatch] == [0]


def test_hfx_serves_the_mature_cached_instance_next_not_every_one_before_it():
    """A request the first instance served leaves for a mature instance further down Q_W:
    that instance is served next; the ones between it and the first are not served at all
    (on the 32-instance session trace they each left it again: 41,622 serves for 7,257
    arrivals)."""
    pol = make_policy("hfx")
    v = cache_view(0.0, 4, {"r": {3: 2400}})
    pol.schedule(v)  # the instances join Q_W
    for i in range(4):  # each has a decode running: serving one moves its maturity on
        pol.shadow[i].add(req(f"b{i}", 0.0, 10, 9.0, 0.5), 10)
    pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
    d = pol.schedule(v)
    assert [(x.request.id, x.instance) for x in d.dispatch] == [("r", 3)]
    # Instance 0 was served (it left r), 1 and 2 were not: mature at 0 still.
    assert pol.maturity[0] > 0.0 and pol.maturity[1] == pol.maturity[2] == 0.0


def test_hfx_takes_a_miss_now_over_a_hit_that_would_start_too_late():
    pol = make_policy("hfx")
    pol.schedule(cache_view(0.0, 2, {}))  # the instances join Q_W
    pol.maturity.set(1, 5.0)  # instance 1 takes no new work before t = 5 s
    pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
    d = pol.schedule(cache_view(0.0, 2, {"r": {1: 2400}}))
    assert [(x.request.id, x.instance) for x in d.dispatch] == [("r", 0)]


def test_hfx_queues_shortest_first_by_the_part_of_the_prompt_it_will_compute():
    pol = make_policy("hfx")
    hits = {"cached": {0: 4950}}
    pol.schedule(cache_view(0.0, 1, hits))  # the dispatcher's view of the caches
    pol.enqueue(req("plain", 0.0, 200, 2.0, 0.5), 0.0)
    pol.enqueue(req("cached", 0.0, 5000, 2.0, 0.5), 0.0)  # 50 tokens to compute
    pol.maturity.set(0, 1.0)  # nothing dispatched: the order is Q_R's
    assert pol.schedule(cache_view(0.0, 1, hits)).dispatch == []
    assert [r.id for r in pol.queue.scan(10)] == ["cached", "plain"]
    pol = make_policy("hfx")  # no view of the caches yet: by the whole prompt
    pol.enqueue(req("plain", 0.0, 200, 2.0, 0.5), 0.0)
    pol.enqueue(req("cached", 0.0, 5000, 2.0, 0.5), 0.0)
    assert [r.id for r in pol.queue.scan(10)] == ["plain", "cached"]


def test_hfx_budgets_and_predicts_the_uncached_part_of_a_prompt():
    pol = make_policy("hfx")
    # Eq. 5 gives an idle instance 6,800 tokens: two whole 2,500-token prompts (as
    # test_hfx_budget_limits_a_batch_and_waits_for_maturity), but all three with 2,400 cached.
    for i in range(3):
        pol.enqueue(req(f"r{i}", 0.0, 2500, 0.7, 0.5), 0.0)
    d = pol.schedule(cache_view(0.0, 1, {f"r{i}": {0: 2400} for i in range(3)}))
    assert [x.request.id for x in d.dispatch] == ["r0", "r1", "r2"]
    # E_p of the batch: 300 new tokens over 2,400 cached each (MODEL has no quadratic term).
    assert pol._prefilled_at[0] == pytest.approx(0.02 + 1e-4 * 300)


def test_hfx_budgets_best_effort_requests_by_the_part_of_the_prompt_it_will_compute():
    # Three hopeless 2,500-token requests (arrived 5 s ago) and Eq. 5's 6,800 tokens on an idle
    # instance: two whole prompts fit, but all three with 2,400 of each cached there.
    pol = make_policy("hfx")
    for i in range(3):
        pol.enqueue(req(f"r{i}", 0.0, 2500, 0.7, 0.5), 5.0)
    d = pol.schedule(cache_view(5.0, 1, {f"r{i}": {0: 2400} for i in range(3)}))
    assert [(x.request.id, x.best_effort) for x in d.dispatch] == [
        ("r0", True), ("r1", True), ("r2", True)]
    pol = make_policy("hfx")
    for i in range(3):
        pol.enqueue(req(f"r{i}", 0.0, 2500, 0.7, 0.5), 5.0)
    assert [x.request.id for x in pol.schedule(cache_view(5.0, 1, {})).dispatch] == ["r0", "r1"]


def test_hfx_deferral_to_a_cached_instance_follows_that_instance_as_it_changes():
    """The verdict of ``elsewhere`` is kept between scans: it must still move with the cached
    instance's maturity and its shadow (what it runs), read anew once either changes."""
    pol = make_policy("hfx")
    v = cache_view(0.0, 2, {"r": {1: 2400}})
    pol.schedule(v)  # the instances join Q_W
    pol.maturity.set(1, 0.62)  # instance 1 takes work at 0.62 s: 100 new tokens, TTFT 0.7 s
    pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
    assert pol.schedule(v).dispatch == []  # it waits for instance 1's hit
    for i in range(600):  # instance 1 takes a batch of 600: its step, 0.09 s, now makes it late
        pol.shadow[1].add(req(f"b{i}", 0.0, 10, 9.0, 0.5), 10)
    assert [(x.request.id, x.instance) for x in pol.schedule(v).dispatch] == [("r", 0)]
    # The same through instance 1's maturity: moved past the deadline, instance 0 takes it.
    pol = make_policy("hfx")
    pol.schedule(v)
    pol.maturity.set(1, 0.62)
    pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
    assert pol.schedule(v).dispatch == []
    pol.maturity.set(1, 5.0)
    assert [(x.request.id, x.instance) for x in pol.schedule(v).dispatch] == [("r", 0)]


def test_hfx_waits_for_a_full_cached_instance_only_while_a_cold_start_would_still_be_in_time():
    """A full instance takes no new work when it matures: a request left for its cache would
    wait there until its deadline (the 32-instance session trace: 1.4% of TTFTs missed)."""
    def full(mature: float) -> tuple[HFXDispatcher, ClusterView]:
        pol = make_policy("hfx")
        v = cache_view(0.0, 2, {"r": {1: 2400}})
        pol.schedule(v)  # the instances join Q_W
        pol.maturity.set(1, mature)
        pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
        assert pol.schedule(v).dispatch == []  # it waits for instance 1's hit (100 tokens)
        for i in range(pol.shadow[1].free_slots()):  # then every sequence slot is taken
            pol.shadow[1].add(req(f"b{i}", 0.0, 1, 9.0, 2.0), 1)
        return pol, v

    # Instance 1 matures at 0.5 s: the 2,500 tokens uncached then (0.27 s) would be late.
    pol, v = full(0.5)
    assert [(x.request.id, x.instance) for x in pol.schedule(v).dispatch] == [("r", 0)]
    # At 0.3 s they would not: it may still wait for a slot there.
    pol, v = full(0.3)
    assert pol.schedule(v).dispatch == []


def test_hfx_sleeps_while_every_queued_request_waits_for_its_cached_instance():
    """Nothing any other instance could take: the idle ones are not served (their maturity
    stays), and the next call is when the view is due to be read again (MATCH_TTL)."""
    pol = make_policy("hfx")
    v = cache_view(0.0, 3, {"r": {1: 2400}})
    pol.schedule(v)
    pol.maturity.set(1, 0.3)
    pol.enqueue(req("r", 0.0, 2500, 0.7, 0.5), 0.0)
    d = pol.schedule(v)
    assert d.dispatch == [] and d.wake_at == pytest.approx(0.05)
    for now in (0.01, 0.2):  # an arrival elsewhere; then past the TTL, read again at 0.2 s
        v.now = now
        d = pol.schedule(v)
        assert d.dispatch == [] and d.wake_at == pytest.approx(0.05 if now < 0.05 else 0.25)
        assert pol.maturity[0] == 0.0 and pol.maturity[2] == 0.0  # not served
    v.now = 0.3  # instance 1 matures: it takes r over its cache
    assert [(x.request.id, x.instance) for x in pol.schedule(v).dispatch] == [("r", 1)]
