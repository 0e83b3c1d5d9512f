"""SLOs-Serve and PolyServe rules on hand-worked cases."""

from __future__ import annotations

import pytest
from conftest import make_engine, seq

from hfx import native
from hfx.config import SimConfig
from hfx.engine import Role
from hfx.engine.stats import InstanceStats
from hfx.policies import ClusterView, InstanceView, make_policy
from hfx.policies.polyserve import IterationTable
from hfx.policies.slos_serve import Item, admit, prefill_rate
from hfx.request import SLO, Request, RequestRecord
from hfx.sim.driver import simulate
from hfx.stepmodel.latency import Profile, StepTimeModel

# Prefill 1 ms per token, no fixed cost; decode steps cost nothing: 1000 prefill tokens/s.
FLAT = StepTimeModel(0.0, 1e-3, 0.0, 0.0, 0.0, 0.0)


def test_prefill_rate_is_what_decodes_leave():
    assert prefill_rate(FLAT, demand=0.0, t0=0.5, ctx_per_seq=100) == pytest.approx(1000)
    decode_cost = StepTimeModel(0.0, 1e-3, 0.0, 0.0, 0.0, 1e-3)  # 1 ms per decode token
    # 100 decode tokens/s at t0 = 0.5: 50 decodes per step take 0.05 s, 0.45 s left → 900/s.
    assert prefill_rate(decode_cost, 100.0, 0.5, 100) == pytest.approx(900)


def test_admission_dp_on_a_hand_solved_case():
    # 1000 prefill tokens/s from now = 0. Deadlines and prompts:
    #   a: 400 tokens by 0.5 s   b: 400 by 0.6 s   c: 300 by 1.0 s
    # a + b need 800 by 0.6 s but only 600 exist: at most one of them. Taking a, then c:
    # 500 − 400 = 100 at 0.5 s, + 500 by 1.0 s = 600 − 300 = 300 ≥ 0: {a, c} is feasible, and
    # no set of three is. The DP must find two, and keep the one that leaves more budget.
    items = [Item("a", 0.5, 400, 0.0, 400), Item("b", 0.6, 400, 0.0, 400),
             Item("c", 1.0, 300, 0.0, 300)]
    chosen = admit(items, 0.0, FLAT, t0=0.1, demand0=0.0, memory_free=1e9, ctx_per_seq=0)
    assert len(chosen) == 2 and "c" in chosen
    # Memory binds: only 700 tokens of KV.
    assert admit(items, 0.0, FLAT, 0.1, 0.0, 700, 0) in (["a", "c"], ["b", "c"])
    # A forced (already admitted) request takes its budget first: nothing else fits by 0.5 s.
    forced = Item("running", 0.45, 450, 0.0, 0.0, forced=True)
    assert admit([forced, Item("x", 0.5, 100, 0.0, 100)], 0.0, FLAT, 0.1, 0.0, 1e9, 0) == []
    assert admit([forced, Item("y", 0.6, 100, 0.0, 100)], 0.0, FLAT, 0.1, 0.0, 1e9, 0) == ["y"]


def test_iteration_table_interpolates_the_profile():
    model = StepTimeModel(0.01, 1e-4, 0.0, 0.02, 1e-7, 1e-4)
    table = IterationTable(model)
    for batch, kv in ((1, 0), (8, 16_000), (64, 64_000)):  # grid points
        assert table.time(batch, kv) == pytest.approx(model.decode_time(kv, batch))
    mid = table.time(12, 40_000)
    assert table.time(8, 16_000) < mid < table.time(16, 64_000)


MODEL = StepTimeModel(0.005, 1e-4, 0.0, 0.01, 1e-8, 1e-4)
PROFILE = Profile("t", MODEL, kv_capacity_tokens=200_000)


def view(n: int, now: float = 0.0, max_num_seqs: int = 1024) -> ClusterView:
    # 1024 sequences over 200k KV tokens: a saturated step of 114 ms, above every tier below.
    views = [InstanceView(i, Role.COLOCATED, InstanceStats(
        i, Role.COLOCATED, now, 0, 0, 0, 0, 0, 12_500, 16, 0, max_num_seqs, 0.0, 0))
        for i in range(n)]
    return ClusterView(now, views, MODEL, PROFILE)


def req(rid: str, tpot: float, prompt: int = 100, arrival: float = 0.0) -> Request:
    return Request(rid, arrival, prompt, 20, SLO(1.0, tpot))


def saturate(pol, iid: int, tpot: float) -> None:
    for k in range(400):  # 400 long requests: the iteration time passes any tier's TPOT
        pol.shadow[iid].add(req(f"fill{iid}-{k}", tpot, prompt=500), 500)


def test_polyserve_load_gradient_and_lazy_promotion():
    pol = make_policy("polyserve")
    v = view(3)
    for i in range(3):
        pol.enqueue(req(f"t{i}", 0.05), 0.0)
    pol.enqueue(req("loose", 0.1), 0.0)
    d = pol.schedule(v)
    placed = {x.request.id: x.instance for x in d.dispatch}
    # The 50 ms tier takes an idle instance and fills it (the highest-load feasible instance);
    # the 100 ms tier, with no instance of its own, takes another idle one.
    assert placed == {"t0": 0, "t1": 0, "t2": 0, "loose": 1}
    assert pol.tier_of == {0: 0.05, 1: 0.1, 2: None}
    # With its own instance full and the idle pool empty, a 100 ms request is promoted onto the
    # tighter tier's instance (lazy promotion).
    saturate(pol, 1, 0.1)
    pol.tier_of[2] = 0.1  # the last instance serves the 100 ms tier too, and is full
    pol.schedule(v)
    saturate(pol, 2, 0.1)
    pol.enqueue(req("promoted", 0.1), 0.0)
    assert [(x.request.id, x.instance) for x in pol.schedule(v).dispatch] == [("promoted", 0)]


def test_polyserve_never_places_a_tighter_request_on_a_looser_instance():
    pol = make_policy("polyserve")
    v = view(2)
    pol.enqueue(req("t0", 0.05), 0.0)
    pol.schedule(v)  # instance 0 joins the 50 ms tier
    saturate(pol, 0, 0.05)
    for k in range(2):
        pol.enqueue(req(f"l{k}", 0.1), 0.0)
    d = pol.schedule(v)  # the tighter instance is full: the 100 ms tier takes instance 1
    assert {x.instance for x in d.dispatch} == {1} and pol.tier_of[1] == 0.1
    pol.enqueue(req("tight", 0.05), 0.0)
    # Instance 1 serves its own 100 ms requests (not on the pending list): too loose for it.
    assert pol.schedule(v).dispatch == []
    assert pol.num_queued() == 1


def test_polyserve_counts_a_tiers_own_requests_where_they_were_placed():
    """An instance runs only other tiers' requests → the pending list (PolyServe §4.4). A
    request promoted onto a tighter instance never counted as that instance's own, so its finish
    must not uncount the instance's own requests when the instance has since joined its tier."""
    from hfx.request import RequestRecord

    pol = make_policy("polyserve")
    v = view(2)
    pol.enqueue(req("tight", 0.05), 0.0)
    pol.enqueue(req("loose", 0.1), 0.0)
    pol.schedule(v)
    assert pol.tier_of == {0: 0.05, 1: 0.1}
    saturate(pol, 1, 0.1)
    pol.enqueue(req("promoted", 0.1), 0.0)
    assert [(x.request.id, x.instance) for x in pol.schedule(v).dispatch] == [("promoted", 0)]

    def finish(rid: str, tpot: float, iid: int) -> None:
        pol.on_finished(RequestRecord(req(rid, tpot), instance=iid), v)

    finish("tight", 0.05, 0)  # instance 0 now runs only a 100 ms request: pending list
    pol.enqueue(req("joins", 0.1), 0.0)  # its tier is full: the pending instance joins it
    assert [(x.request.id, x.instance) for x in pol.schedule(v).dispatch] == [("joins", 0)]
    assert pol.tier_of[0] == 0.1
    finish("promoted", 0.1, 0)
    # "joins" still runs there as the tier's own: instance 0 is not free for the 50 ms tier.
    pol.enqueue(req("tight2", 0.05), 0.0)
    assert pol.schedule(v).dispatch == [] and pol.tier_of[0] == 0.1


def test_polyserve_merges_the_tiers_a_saturated_engine_meets_anyway():
    """PolyServe §5.1: TPOTs beyond the engine's saturated step are one tier. With 256
    sequences over 200k KV tokens a step takes at most 37.6 ms, so 50 and 100 ms requests share
    a tier (and an instance); 20 ms is tighter and keeps its own."""
    pol = make_policy("polyserve")
    for rid, tpot in (("a", 0.05), ("b", 0.1), ("c", 0.02)):
        pol.enqueue(req(rid, tpot), 0.0)
    d = pol.schedule(view(3, max_num_seqs=256))
    saturated = MODEL.decode_time(200_000, 256)
    assert saturated == pytest.approx(0.0376)
    assert pol.tier(0.05) == pol.tier(0.1) == saturated and pol.tier(0.02) == 0.02
    placed = {x.request.id: x.instance for x in d.dispatch}
    assert placed["a"] == placed["b"] != placed["c"]
    assert sorted(t for t in pol.tier_of.values() if t) == [0.02, saturated]
    pol.enqueue(req("d", 0.2), 0.0)  # queued by its tier once the engine is known
    assert pol._queues[saturated][0][1] == "d"


def test_dynamic_chunking_runs_a_short_remainder_at_once(vloop):
    engine, ex = make_engine(planner="tpot-chunked", max_num_batched_tokens=8, step_model=MODEL)
    engine.add_request(seq("a", 20, 1))  # 20 ≥ 2 × 8: chunk of 8
    engine.add_request(seq("b", 5, 1))

    async def steps(n):
        for _ in range(n):
            await engine.step()

    vloop.run_until_complete(steps(3))
    # Step 1: a (20 ≥ 2 × 8) gets a chunk of 8, the whole budget. Step 2: a's remaining 12 is
    # under 2 × 8, so it runs at once, over the budget, and nothing is admitted beside it.
    # Step 3: b.
    assert ex.plans == [{"a": 8}, {"a": 12}, {"b": 5}]


@pytest.mark.parametrize("policy", ["slos-serve", "polyserve"])
def test_peer_policies_serve_everything(policy):
    r = simulate(SimConfig(policy=policy, workload="two-task", qps=120, requests_per_task=40))
    assert r["finished"] == r["requests"] == 80 and r["attainment"] > 0.5


def test_capacity_interpolates_the_90_percent_crossing():
    from hfx.evaluation.sweep import capacity

    def row(series, qps, att):
        return {"series": series, "qps": qps, "attainment": att, "attainment_dslo": att,
                "instances": 2, "config": {"max_instances": None}}

    rows = [row("a", 10, 1.0), row("a", 20, 0.95), row("a", 30, 0.85), row("b", 10, 0.5),
            row("c", 10, 1.0), row("c", 20, 0.99)]
    cap = capacity(rows)
    assert cap["a"] == pytest.approx(25 / 2)  # 0.95 → 0.85 crosses 0.9 halfway, 2 instances
    assert cap["b"] is None  # misses even at the lowest load
    assert cap["c"] == pytest.approx(10.0)  # never crosses: the highest QPS tried


@pytest.mark.parametrize(("deadline_in", "planner", "chunk"), [
    (0.15, "deadline-chunked", 800),  # paced chunks (0.18 s) miss; whole (0.085 s) keeps it
    (0.15, "tpot-chunked", 98),       # PolyServe's rule paces it regardless
    (1.0, "deadline-chunked", 98),    # paced chunks end within 0.4 of the time left
    (0.05, "deadline-chunked", 98),   # even whole misses: no stall for a lost prompt
])
def test_deadline_chunking_runs_a_prompt_whole_when_paced_chunks_would_miss(
        vloop, deadline_in, planner, chunk):
    engine, ex = make_engine(num_blocks=512, planner=planner, step_model=MODEL)
    engine.add_request(seq("d", 4, 50, tpot=0.02))

    async def step():
        await engine.step()

    vloop.run_until_complete(step())  # d's prompt: from now on it decodes
    # Beside d (TPOT 20 ms) a step has room for (0.02 − 0.01 − 1e-4 − 1e-8·5) / 1e-4 = 98.99
    # prefill tokens: 98 a step, so 800 tokens take 9 steps, 0.18 s; alone they take 0.085 s.
    engine.add_request(seq("p", 800, 1, prefill_deadline=vloop.time() + deadline_in))
    vloop.run_until_complete(step())
    assert ex.plans[-1] == {"d": 1, "p": chunk}


@pytest.mark.skipif(native.active(), reason="compiled, the module calls its own admit directly")
def test_slos_serve_admission_plans_at_its_pace(monkeypatch):
    """The admission DP's step is pace × the tightest TPOT, with the pace it was given (the one
    its engine runs at), not the planner class's default."""
    import hfx.policies.slos_serve as slos

    steps: list[float] = []

    def admit(items, now, model, t0, *rest):
        steps.append(t0)
        return [items[-1].key]

    monkeypatch.setattr(slos, "admit", admit)
    pol = make_policy("slos-serve", pace=0.5, decide_steps=0)
    pol.enqueue(req("a", 0.1), 0.0)
    pol.schedule(view(2))
    assert steps and steps[0] == pytest.approx(0.5 * 0.1)


def backed_up_view(now: float) -> ClusterView:
    """One instance whose queued prompts (80k tokens at its last snapshot) put any new first
    token seconds out, with room to spare for TPOT and KV."""
    stats = InstanceStats(0, Role.COLOCATED, 0.0, 0, 0, 0, 0, 5_000, 12_500, 16, 0, 1024, 0.0, 0)
    return ClusterView(now, [InstanceView(0, Role.COLOCATED, stats)], MODEL, PROFILE)


def test_polyserve_walks_a_stuck_tier_again_once_its_head_loses_its_ttft():
    """A request that misses on its TTFT misses again as time passes, so PolyServe skips the
    walk while nothing moves; once its TTFT is lost whatever happens, it is placed for its
    TPOT alone, with no other event to wake the tier."""
    pol = make_policy("polyserve")
    v = backed_up_view(0.0)
    pol.enqueue(Request("r", 0.0, 100, 20, SLO(1.0, 0.05)), 0.0)
    for now in (0.0, 0.5, 0.9):
        v.now = now
        assert pol.schedule(v).dispatch == [], now
    v.now = 1.0  # 1.0 + its prompt's prefill is past arrival + TTFT: lost
    assert [(d.request.id, d.instance) for d in pol.schedule(v).dispatch] == [("r", 0)]


def test_polyserve_walks_a_stuck_tier_again_when_a_request_joins_its_queue():
    pol = make_policy("polyserve")
    v = backed_up_view(0.0)
    pol.enqueue(Request("r", 0.0, 100, 20, SLO(1.0, 0.05)), 0.0)
    assert pol.schedule(v).dispatch == []
    # Behind it in deadline order, with a TTFT the queue can meet: the walk reaches it.
    pol.enqueue(Request("patient", 0.0, 100, 20, SLO(60.0, 0.05)), 0.0)
    v.now = 0.1
    assert [d.request.id for d in pol.schedule(v).dispatch] == ["patient"]


def test_scorpio_rejects_at_its_guards_time_with_nothing_else_moving():
    """SCORPIO's TTFT guard rejects a queued request once the prefills ahead of it cannot end
    by its deadline. A call walks only the queues that may decide differently, so the guard's
    own time must bring the queue back into the walk: no finish or snapshot comes here."""
    pol = make_policy("scorpio")
    v = view(1, max_num_seqs=1)
    pol.enqueue(req("running", 0.05), 0.0)
    assert [d.request.id for d in pol.schedule(v).dispatch] == ["running"]  # the only slot
    pol.enqueue(req("late", 0.05, arrival=0.0), 0.0)  # TTFT 1.0 s: deadline 1.0
    d = pol.schedule(v)
    assert d.dispatch == [] and d.reject == [] and d.wake_at is not None
    due = d.wake_at  # the guard's time: the deadline less the request's prefill
    assert 0.9 < due < 1.0
    v.now = due / 2
    assert pol.schedule(v).reject == []  # not yet
    v.now = due + 1e-6
    assert [r.id for r in pol.schedule(v).reject] == ["late"]


def test_scorpio_wakes_for_no_queue_that_was_emptied():
    pol = make_policy("scorpio")
    v = view(1, max_num_seqs=1)
    pol.enqueue(req("running", 0.05), 0.0)
    pol.schedule(v)
    pol.enqueue(req("queued", 0.05), 0.0)
    assert pol.schedule(v).wake_at is not None
    assert pol.withdraw("queued")  # the client went away: nothing waits any more
    v.now = 0.1
    assert pol.schedule(v).wake_at is None


def test_polyserve_kv_peak_counts_requests_growing_and_exiting():
    """PolyServe §4.5: the KV over a new request's life, its requests growing a token an
    iteration and exiting at their predicted ends. Running: a (2 iterations left, 108 tokens
    now) and b (109 left, 1000 now); a new prompt of 50."""
    from hfx.policies.polyserve import _Exits

    def exits_of(*rows: tuple[float, float]) -> _Exits:
        exits = _Exits(0, 0.0)
        for k, (remaining, held) in enumerate(rows):
            exits.join(str(k), remaining, held)
        exits.fold()
        return exits

    exits = exits_of((109.0, 1000.0), (2.0, 108.0))
    # 20 iterations: at 0, 1158; just before a exits (t = 2), 1108 + 2·2 + 50 + 2 = 1164; at
    # the end, b alone: 1000 + 20 + 50 + 20 = 1090.
    assert exits.peak(50, 20) == 1164
    # 200: just before b exits (t = 109), 1000 + 109 + 50 + 109 = 1268; grown without exits,
    # it would be 1108 + 50 + 3·200 = 1758.
    assert exits.peak(50, 200) == 1268
    assert exits.peak(50, 1) == 1108 + 2 * 1 + 50 + 1
    # Exits are binned, each at its bin's upper edge: 100 left counts as 109 (never early).
    assert exits_of((100.0, 1000.0), (2.0, 108.0)).peak(50, 200) == 1268
    # b leaves: a alone, then the new request.
    exits.leave("0")
    exits.fold()
    assert exits.peak(50, 200) == 50 + 200


def test_polyserve_shares_what_the_snapshot_shows_generated_by_time_since_placement():
    """The snapshot's context less the prompts is what the running requests generated; an
    older request has generated more of it, exits sooner and holds more KV. One placed after
    the snapshot has generated nothing."""
    pol = make_policy("polyserve")
    pol.schedule(view(1, now=10.0))  # learns the engine: the iteration table
    sh = pol.shadow[0]
    for k, placed in enumerate([0.0] * 4 + [6.0] * 4 + [12.0]):
        r = req(f"r{k}", 0.1)
        sh.add(r, 150.0)
        pol._placed_at[r.id] = placed
    pol._stats_time[0] = 10.0
    sh.decode_ctx += 560  # generated: 560 tokens over 4·10 + 4·4 s of age, 10 per second
    exits = pol._exits(sh)
    # The old four: 100 out, 50 left (binned: 56), 200 held; the young four: 40 out, 110 left
    # (136), 140 held; the last: 150 left (170), 100 held.
    assert exits.ctx_from[0] == 4 * 200 + 4 * 140 + 100
    # The peak of a new empty request living 1000 iterations is just before the old four
    # exit: 1460 + (9 + 1)·56 (ignoring their progress: 900 + 10·170 = 2600).
    assert exits.peak(0, 1000) == 1460 + 10 * 56
    # A request placed now joins them as a rebuild would count it: all its output ahead.
    before, late = sh.version, req("late", 0.1)
    sh.add(late, 150.0)
    pol._placed_at[late.id] = 10.0
    pol._joined(sh, late, before)
    joined = pol._exit_cache[0]
    assert joined.version == sh.version and pol._exits(sh) is joined
    del pol._exit_cache[0]
    rebuilt = pol._exits(sh)
    assert (joined.peaks, joined.ctx_from) == (rebuilt.peaks, rebuilt.ctx_from)

    # One far past its predicted output exits at the next iteration but holds all it grew to.
    pol2 = make_policy("polyserve")
    pol2.schedule(view(1, now=10.0))
    sh2 = pol2.shadow[0]
    long = req("long", 0.1)
    sh2.add(long, 50.0)
    pol2._placed_at[long.id], pol2._stats_time[0] = 0.0, 10.0
    sh2.decode_ctx += 2000
    assert pol2._exits(sh2).peak(10, 50) == 10 + 2100 + 2 * 1  # just before it exits


def test_slos_serve_forces_the_prompts_admitted_since_the_last_snapshot():
    """SLOs-Serve's forced work (continuous optimisation, §3.2.1) is the prompts admitted since
    the instance's last snapshot; one admitted before it, with no waiting tokens in the
    snapshot, is prefilled already. Here (about 8,900 prefill tokens/s) a prompt of 8,000
    admitted after the snapshot leaves no room by 1.7 s for another one of 8,000."""
    pol = make_policy("slos-serve", route_limit=1, decide_steps=0)
    pol.enqueue(req("older", 0.1, prompt=100), 0.0)
    assert [d.request.id for d in pol.schedule(view(1)).dispatch] == ["older"]
    v = view(1, now=0.5)  # the snapshot at 0.5: "older" is in it, prefilled
    v.now = 0.6
    pol.enqueue(req("old", 0.1, prompt=8000, arrival=0.6), 0.6)
    assert [(d.request.id, d.best_effort) for d in pol.schedule(v).dispatch] == [("old", False)]
    v.now = 0.7
    pol.enqueue(req("new", 0.1, prompt=8000, arrival=0.7), 0.7)
    # "old" (deadline 1.6) goes first: 0.9 s of budget, 8,000 of it taken; by 1.7 s, 0.1 s
    # more: not 8,000. Declined on its one replica, "new" goes best effort.
    assert [(d.request.id, d.best_effort) for d in pol.schedule(v).dispatch] == [("new", True)]


@pytest.mark.parametrize(("decide_steps", "admitted"), [(1.0, ["s1", "s2"]), (0.0, ["big"])])
def test_slos_serve_admits_the_largest_set_of_the_requests_one_batch_brought(
        decide_steps, admitted):
    """SLOs-Serve decides the requests that arrived during a batch together (§3.1, Algorithm 1):
    of a 7,000-token prompt and two of 4,000 due by about 1 s (some 8,900 prefill tokens/s),
    its DP admits the two small ones, where deciding each on arrival admits the first."""
    pol = make_policy("slos-serve", route_limit=1, decide_steps=decide_steps)
    v = view(1)
    out = []
    for rid, prompt, at in (("big", 7000, 0.0), ("s1", 4000, 0.002), ("s2", 4000, 0.004)):
        v.now = at
        pol.enqueue(req(rid, 0.1, prompt=prompt, arrival=at), at)
        out.append(pol.schedule(v))
    if decide_steps:  # nothing decided within the batch: a wake-up at its end, one step on
        assert [(d.dispatch, d.wake_at) for d in out] == [([], MODEL.decode_a)] * 3
        v.now = MODEL.decode_a
        out.append(pol.schedule(v))
    placed = [d for o in out for d in o.dispatch]
    assert sorted(d.request.id for d in placed if not d.best_effort) == admitted
    assert len(placed) == 3  # the declined are served best effort, not lost


def test_slos_serve_forces_the_latest_deadline_prompts_of_a_snapshots_waiting_tokens():
    """Of the prompts admitted before the snapshot, SLOs-Serve's forced work is the latest
    deadline ones that make up the snapshot's waiting tokens; equal deadlines in admission
    order; a finished request is none of them. Two prompts due at 1.0 s, 100 and 8,000
    tokens, admitted in that order; the snapshot at 0.5 s waits on 96 tokens: the first, so a
    prompt of 8,000 due at 1.6 s fits (about 8,900 prefill tokens/s). Had the first finished,
    the 8,000 of the second would make up the waiting tokens, and it would not."""

    def placed(finish_small: bool) -> bool:
        pol = make_policy("slos-serve", route_limit=1, decide_steps=0)
        v = view(1)
        for rid, prompt in (("small", 100), ("large", 8000)):
            pol.enqueue(req(rid, 0.1, prompt=prompt), 0.0)
        assert sorted(d.request.id for d in pol.schedule(v).dispatch) == ["large", "small"]
        if finish_small:
            pol.on_finished(RequestRecord(req("small", 0.1, prompt=100), 0.0, 0), v)
        snapshot = view(1, now=0.6)
        stats = snapshot.instances[0].stats
        snapshot.instances[0].stats = InstanceStats(
            0, Role.COLOCATED, 0.5, 1, 1, 0, 0, 6, stats.kv_total_blocks, stats.block_size, 0,
            stats.max_num_seqs, 0.0, 0)
        pol.enqueue(req("next", 0.1, prompt=8000, arrival=0.6), 0.6)
        (d,) = pol.schedule(snapshot).dispatch
        return not d.best_effort

    assert placed(finish_small=False)
    assert not placed(finish_small=True)
