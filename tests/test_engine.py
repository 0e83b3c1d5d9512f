"""Engine core with real planners and block manager, and a fake executor: exact token counts."""

from __future__ import annotations

import pytest
from conftest import make_engine, seq

from hfx.engine import EngineError, RequestStatus, Role
from hfx.stepmodel.latency import StepTimeModel


async def drain(engine, check=None):
    """Step until idle; return {request id: token times} and every transition."""
    tokens: dict[str, list[float]] = {}
    transitions = []
    for _ in range(10_000):
        if not engine.has_work():
            break
        out = await engine.step()
        for rid in out.request_ids:
            tokens.setdefault(rid, []).append(out.time)
        transitions.extend(out.transitions)
        if check:
            check(engine)
    else:
        raise AssertionError("engine did not drain")
    return tokens, transitions


def test_prefill_first_runs_prefill_alone_then_decodes(vloop):
    engine, ex = make_engine(planner="prefill-first")
    engine.add_request(seq("a", 10, 3))
    engine.add_request(seq("b", 6, 2))

    tokens, transitions = vloop.run_until_complete(drain(engine))

    # Step 1: both prompts whole, no decodes. Then one decode token each until done.
    assert ex.plans == [{"a": 10, "b": 6}, {"a": 1, "b": 1}, {"a": 1}]
    assert {k: len(v) for k, v in tokens.items()} == {"a": 3, "b": 2}
    assert sorted(transitions) == [("a", RequestStatus.FINISHED_LENGTH),
                                   ("b", RequestStatus.FINISHED_LENGTH)]
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_prefill_first_pauses_decodes_for_a_new_prompt(vloop):
    engine, ex = make_engine(planner="prefill-first")
    engine.add_request(seq("a", 4, 5))

    async def scenario():
        await engine.step()  # prefill a
        await engine.step()  # decode a
        engine.add_request(seq("b", 8, 2))
        await engine.step()  # prefill-only step: a's decode pauses
        await engine.step()

    vloop.run_until_complete(scenario())
    assert ex.plans == [{"a": 4}, {"a": 1}, {"b": 8}, {"a": 1, "b": 1}]


def test_prefill_first_token_budget_bounds_a_prefill_batch(vloop):
    engine, ex = make_engine(planner="prefill-first", max_num_batched_tokens=16)
    for rid, n in (("a", 10), ("b", 10), ("c", 30)):
        engine.add_request(seq(rid, n, 1))
    vloop.run_until_complete(drain(engine))
    # b does not fit beside a; c is longer than the budget and runs alone rather than never.
    assert ex.plans == [{"a": 10}, {"b": 10}, {"c": 30}]


def test_chunked_runs_decodes_first_then_chunks(vloop):
    engine, ex = make_engine(planner="chunked", max_num_batched_tokens=8)
    engine.add_request(seq("a", 3, 4))

    async def scenario():
        await engine.step()
        engine.add_request(seq("b", 20, 1))
        for _ in range(4):
            await engine.step()

    vloop.run_until_complete(scenario())
    # a prefills (token 1), then decodes 1 token a step (tokens 2-4) while b's prompt fills the
    # rest of the budget in chunks of 7, 7 and the last 6; both finish in step 4.
    assert ex.plans == [{"a": 3}, {"a": 1, "b": 7}, {"a": 1, "b": 7}, {"a": 1, "b": 6}]
    assert not engine.has_work()


def test_chunked_step_shape_counts_chunk_over_cached_prefix(vloop):
    from hfx.engine.planners import make_planner
    from hfx.engine.planners.base import EngineState

    engine, _ = make_engine(planner="chunked", max_num_batched_tokens=8)
    s = seq("a", 20, 1)
    engine.add_request(s)
    planner = make_planner(engine.config)
    out1 = planner.plan(engine.state)
    assert out1.shape.prefill_tokens == 8 and out1.shape.prefill_sq == 8 * 8
    s.num_computed_tokens = 8
    out2 = planner.plan(EngineState(engine.state.waiting, engine.state.running, engine.kv))
    # 8 new tokens after 8 cached: Σ c·(k + c) = 8·16.
    assert out2.shape.prefill_tokens == 8 and out2.shape.prefill_sq == 8 * 16


PREEMPTING = ["prefill-first", "chunked", "tpot-chunked", "deadline-chunked", "vllm"]
STEP_MODEL = StepTimeModel(0.01, 1e-4, 0.0, 0.005, 1e-6, 1e-4)


@pytest.mark.parametrize("planner", PREEMPTING)
def test_preemption_under_kv_pressure_loses_no_request(vloop, planner):
    # 12 blocks of 4 tokens = 48 tokens of KV for 6 requests that need 20 tokens each.
    engine, ex = make_engine(num_blocks=12, block_size=4, planner=planner, watermark=0.0,
                             step_model=STEP_MODEL)
    seqs = [seq(f"r{i}", 8, 12) for i in range(6)]
    for s in seqs:
        engine.add_request(s)
    assert engine.state.waiting.blocks == 6 * 2
    peak, requeued = [], []

    def check(e):
        used = e.kv.num_used_blocks
        assert used <= e.kv.num_blocks
        owned = sum(s.num_blocks for s in e.state.running)
        assert owned == used  # no leaked or double-owned blocks
        peak.append(used)
        # The queue's running total of the blocks it will need (what stats report), through
        # admissions and preemptions back to the front.
        assert e.state.waiting.blocks == sum(-(-s.num_tokens // 4) for s in e.state.waiting)
        requeued.append(sum(s.num_preemptions > 0 for s in e.state.waiting))

    tokens, transitions = vloop.run_until_complete(drain(engine, check))
    assert {k: len(v) for k, v in tokens.items()} == {f"r{i}": 12 for i in range(6)}
    assert sorted(rid for rid, _ in transitions) == [f"r{i}" for i in range(6)]  # once each
    assert sum(s.num_preemptions for s in seqs) >= 1, "the scenario should force preemption"
    # A recompute prefills prompt + generated tokens, more than any prompt alone.
    recomputes = sum(1 for plan in ex.plans for n in plan.values() if n > 8)
    assert recomputes >= 1
    if planner == "prefill-first":  # whole prompts: one recompute prefill per preemption
        assert sum(s.num_preemptions for s in seqs) == recomputes
    assert max(peak) == engine.kv.num_blocks
    assert max(requeued) >= 1  # the total was checked with preempted sequences queued
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert engine.state.waiting.blocks == 0


def test_recompute_keeps_generated_tokens(vloop):
    engine, _ = make_engine(num_blocks=5, block_size=4, planner="prefill-first", watermark=0.0,
                            tokens={"a": [7, 8, 9, 10, 11, 12], "b": [1, 2, 3, 4, 5, 6]})
    a, b = seq("a", 7, 6), seq("b", 7, 6)
    engine.add_request(a)
    engine.add_request(b)
    vloop.run_until_complete(drain(engine))
    assert a.output_token_ids == [7, 8, 9, 10, 11, 12]
    assert b.output_token_ids == [1, 2, 3, 4, 5, 6]
    assert a.num_preemptions + b.num_preemptions >= 1


def test_stop_token_finishes_early(vloop):
    engine, _ = make_engine(tokens={"a": [5, 6, 2, 9]})
    s = seq("a", 4, 4, stop_token_ids=frozenset({2}))
    engine.add_request(s)
    _, transitions = vloop.run_until_complete(drain(engine))
    assert s.output_token_ids == [5, 6, 2]
    assert transitions == [("a", RequestStatus.FINISHED_STOPPED)]


def test_finished_sequences_leave_the_running_list_which_keeps_admission_order(vloop):
    """Finishes in the middle and at either end of the running list: the others stay, in
    admission order (which decides preemption victims), and a late admission goes last."""
    engine, _ = make_engine(num_blocks=64)
    for rid, out in (("a", 6), ("b", 2), ("c", 9), ("d", 3), ("e", 2)):
        engine.add_request(seq(rid, 4, out))
    seen = []

    def check(engine):
        seen.append([s.request_id for s in engine.state.running])
        if len(seen) == 2:
            engine.add_request(seq("f", 4, 3))

    vloop.run_until_complete(drain(engine, check))
    lists = [ids for k, ids in enumerate(seen) if k == 0 or ids != seen[k - 1]]
    assert lists == [["a", "b", "c", "d", "e"], ["a", "c", "d"], ["a", "c", "d", "f"],
                     ["a", "c", "f"], ["a", "c"], ["c"], []]


def test_abort_frees_kv_and_reports_once(vloop):
    engine, _ = make_engine()
    engine.add_request(seq("a", 8, 50))
    engine.add_request(seq("b", 8, 3))

    async def scenario():
        await engine.step()
        engine.add_request(seq("c", 9, 2))  # 3 blocks of 4, waiting
        assert engine.state.waiting.blocks == 3
        assert engine.abort("c")
        assert engine.abort("a")
        assert not engine.abort("nope")
        return await drain(engine)

    tokens, transitions = vloop.run_until_complete(scenario())
    assert ("a", RequestStatus.FINISHED_ABORTED) in transitions
    assert [t for t in transitions if t[0] == "a"] == [("a", RequestStatus.FINISHED_ABORTED)]
    assert ("c", RequestStatus.FINISHED_ABORTED) in transitions and "c" not in tokens
    assert engine.state.waiting.blocks == 0
    assert len(tokens["b"]) == 2  # b's first token came in the first step
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_prefill_role_holds_kv_until_released(vloop):
    engine, ex = make_engine(role=Role.PREFILL)
    engine.add_request(seq("a", 9, 5))
    tokens, transitions = vloop.run_until_complete(drain(engine))
    assert len(tokens["a"]) == 1 and transitions == [("a", RequestStatus.PREFILLED)]
    assert ex.plans == [{"a": 9}]  # never decoded here
    assert engine.kv.num_used_blocks == 3  # 9 tokens in blocks of 4, held
    moved = engine.release("a")
    assert moved.status is RequestStatus.FINISHED_MIGRATED
    assert moved.num_computed_tokens == 9 and moved.output_token_ids == [0]
    assert engine.kv.num_used_blocks == 0


def test_decode_role_accepts_a_prefilled_sequence(vloop):
    prefill, _ = make_engine(role=Role.PREFILL)
    decode, ex = make_engine(role=Role.DECODE)
    prefill.add_request(seq("a", 9, 4))
    vloop.run_until_complete(drain(prefill))
    moved = prefill.release("a")
    decode.add_request(moved)
    tokens, _ = vloop.run_until_complete(drain(decode))
    # The KV arrives with the sequence; only decodes run here: 3 more tokens.
    assert ex.plans == [{"a": 1}, {"a": 1}, {"a": 1}]
    assert len(tokens["a"]) == 3 and len(moved.output_token_ids) == 4


def test_requests_that_can_never_run_are_refused():
    engine, _ = make_engine(num_blocks=4, block_size=4, max_model_len=100)
    with pytest.raises(EngineError, match="context"):
        engine.add_request(seq("a", 90, 20))
    with pytest.raises(EngineError, match="KV cache"):
        engine.add_request(seq("b", 10, 10))
    engine.add_request(seq("c", 8, 8))
    with pytest.raises(EngineError, match="duplicate"):
        engine.add_request(seq("c", 8, 8))


@pytest.mark.parametrize("planner", PREEMPTING)
def test_preemption_takes_the_most_recently_admitted_first(vloop, planner):
    # 10 blocks of 4 tokens; four requests of 8 + 12 tokens are admitted in order r0..r3 and
    # outgrow the cache while decoding: the newest admitted loses its KV first (vLLM's rule),
    # the oldest never does.
    engine, _ = make_engine(num_blocks=10, block_size=4, planner=planner, watermark=0.0,
                            step_model=STEP_MODEL)
    seqs = [seq(f"r{i}", 8, 12) for i in range(4)]
    for s in seqs:
        engine.add_request(s)
    order: list[str] = []

    def check(e):
        for s in seqs:
            if s.num_preemptions > order.count(s.request_id):
                order.append(s.request_id)

    vloop.run_until_complete(drain(engine, check))
    assert order and order[0] == "r3"
    assert seqs[0].num_preemptions == 0


def test_watermark_keeps_blocks_free_for_running_decodes(vloop):
    # 20 blocks, watermark 25% = 5 blocks. r0 runs (3 blocks); r1 needs 13 blocks: admitting it
    # would leave 4 < 5 free, so it waits while r0 runs; without a watermark it is admitted.
    def first_admitted_with(watermark: float) -> list[dict[str, int]]:
        engine, ex = make_engine(num_blocks=20, block_size=4, watermark=watermark)
        engine.add_request(seq("r0", 10, 4))

        async def go():
            await engine.step()  # r0's prefill: r0 is running now
            engine.add_request(seq("r1", 50, 1))
            await engine.step()

        vloop.run_until_complete(go())
        return ex.plans

    assert first_admitted_with(0.25)[1] == {"r0": 1}  # r1 held back: r0 decodes
    assert first_admitted_with(0.0)[1] == {"r1": 50}  # r1 admitted: prefill first


def test_slo_paced_best_effort_takes_leftovers_and_is_preempted_for_an_slo_request(vloop):
    """SLOs-Serve (SLOs-Serve §4.1): best-effort work runs on what SLO work leaves and is the
    first to lose its KV; an SLO request is never preempted for it."""
    from hfx.stepmodel.latency import StepTimeModel

    model = StepTimeModel(1e-3, 1e-5, 0.0, 1e-3, 0.0, 1e-4)
    engine, ex = make_engine(num_blocks=10, block_size=4, planner="slo-paced", watermark=0.0,
                             step_model=model)
    be = seq("be", 16, 20, best_effort=True)
    slo = seq("slo", 16, 12, tpot=0.05, prefill_deadline=1.0)
    engine.add_request(be)
    engine.add_request(slo)
    vloop.run_until_complete(drain(engine))
    assert ex.plans[0] == {"slo": 16, "be": 16}  # the SLO prompt first, best effort after it
    # 10 blocks: slo needs 7 at its end (28 tokens), be 9: be yields, never slo.
    assert be.num_preemptions >= 1 and slo.num_preemptions == 0
    assert len(slo.output_token_ids) == 12 and len(be.output_token_ids) == 20


def test_slo_paced_prefills_earliest_deadline_first(vloop):
    from hfx.stepmodel.latency import StepTimeModel

    model = StepTimeModel(1e-3, 1e-5, 0.0, 1e-3, 0.0, 1e-4)
    engine, ex = make_engine(num_blocks=1024, block_size=16, planner="slo-paced",
                             step_model=model)
    engine.add_request(seq("late", 1500, 2, tpot=0.05, prefill_deadline=5.0))
    engine.add_request(seq("early", 1500, 2, tpot=0.05, prefill_deadline=1.0))
    vloop.run_until_complete(engine.step())
    assert ex.plans[0] == {"early": 1500, "late": 548}  # 2,048 tokens a step without decodes


def test_slo_paced_decodes_a_request_without_a_tpot_on_leftover_budget(vloop):
    # Nothing paces it, so it decodes like best effort; it used to never decode at all (the
    # engine then planned empty steps forever).
    from hfx.stepmodel.latency import StepTimeModel

    model = StepTimeModel(1e-3, 1e-5, 0.0, 1e-3, 0.0, 1e-4)
    engine, ex = make_engine(planner="slo-paced", step_model=model)
    free = seq("free", 8, 5)
    slo = seq("slo", 8, 5, tpot=0.05, prefill_deadline=1.0)
    engine.add_request(free)
    engine.add_request(slo)
    tokens, _ = vloop.run_until_complete(drain(engine))
    assert {k: len(v) for k, v in tokens.items()} == {"free": 5, "slo": 5}
    assert ex.plans[0] == {"slo": 8, "free": 8}  # the SLO prompt first, then the other


def test_a_planner_takes_its_tunables_from_the_config_and_refuses_unknown_ones():
    """What a fair comparison tunes: each engine's planner, its class untouched."""
    from hfx.config import SimConfig
    from hfx.engine.planners.slo_paced import DEFAULT_PACE
    from hfx.sim.driver import resolve_profile, sim_cluster

    model = StepTimeModel(1e-3, 1e-5, 0.0, 1e-3, 0.0, 1e-4)
    engine, _ = make_engine(planner="slo-paced", step_model=model, planner_params={"pace": 0.7})
    untouched, _ = make_engine(planner="slo-paced", step_model=model)  # the default stays
    assert engine.planner.pace == 0.7 and untouched.planner.pace == DEFAULT_PACE == 0.9
    with pytest.raises(ValueError, match=r"no parameter 'slack_share' .*its parameters: pace"):
        make_engine(planner="slo-paced", step_model=model, planner_params={"slack_share": 0.5})
    with pytest.raises(ValueError, match="its parameters: none"):
        make_engine(planner="prefill-first", planner_params={"pace": 0.5})
    config = SimConfig(policy="hfx", instances=2, planner_params={"slack_share": 0.25})
    control = sim_cluster(config, resolve_profile(config))
    assert [i.engine.planner.slack_share for i in control.instances.values()] == [0.25, 0.25]


@pytest.mark.parametrize(("prefill_alone", "tpot", "max_num_seqs", "step_with_b"), [
    (0.0, 0.05, 8, {"a": 1, "b": 100}),  # off: b's chunk beside a's decode, as PolyServe's
    (1.0, 0.05, 8, {"b": 100}),  # a is 0.2 s ahead of its TPOT: b prefills alone
    # a's 0.1 ms TPOT: it is behind (steps take 10 ms), so b's chunk is what fits beside it
    (1.0, 1e-4, 8, {"a": 1, "b": 1}),
    (0.5, 0.05, 2, {"a": 1, "b": 100}),  # one of two slots runs: not below half of them
])
def test_deadline_chunked_prefills_alone_only_while_decodes_are_ahead_and_slots_free(
        vloop, prefill_alone, tpot, max_num_seqs, step_with_b):
    model = StepTimeModel(1e-3, 1e-5, 0.0, 1e-3, 0.0, 1e-4)  # b's 100-token prefill: 2 ms
    engine, ex = make_engine(num_blocks=256, planner="deadline-chunked", step_model=model,
                             max_num_seqs=max_num_seqs,
                             planner_params={"prefill_alone": prefill_alone})
    engine.add_request(seq("a", 8, 50, tpot=tpot, prefill_deadline=1.0))

    async def scenario():
        for _ in range(4):  # a's prefill, then three decodes: four tokens sampled
            await engine.step()
        engine.add_request(seq("b", 100, 2, tpot=0.05, prefill_deadline=2.0))
        await engine.step()

    vloop.run_until_complete(scenario())
    assert ex.plans[:4] == [{"a": 8}, {"a": 1}, {"a": 1}, {"a": 1}]
    assert ex.plans[4] == step_with_b


def test_deadline_queue_serves_earliest_ttft_deadline_first_and_the_late_last():
    """DeadlineWaitingQueue: in-time prompts by TTFT deadline; past it, best effort or with no
    TTFT, after them in arrival order; a preempted one goes back by its deadline."""
    from hfx.engine.waiting import DeadlineWaitingQueue

    q = DeadlineWaitingQueue(lambda n: -(-n // 4))
    a, b, c = (seq("a", 8, 2, prefill_deadline=3.0), seq("b", 8, 2, prefill_deadline=1.0),
               seq("c", 8, 2, prefill_deadline=2.0))
    none, lost = seq("n", 4, 2), seq("x", 4, 2, prefill_deadline=0.5, best_effort=True)
    for s in (none, a, b, lost, c):
        q.append(s)
    assert [s.request_id for s in q] == ["b", "c", "a", "n", "x"]
    assert q[0] is b and len(q) == 5 and q.blocks == 3 * 2 + 2 * 1
    q.settle(1.5)  # b's deadline has passed: behind everything still in time
    assert [s.request_id for s in q] == ["c", "a", "n", "x", "b"]
    q.remove(a)
    q.appendleft(a)  # preempted: it has started, so before every waiting one
    assert [s.request_id for s in q] == ["a", "c", "n", "x", "b"]
    for s in (a, c, none, lost, b):
        assert q[0] is s
        q.remove(s)
    assert not q and q.blocks == 0


def test_deadline_chunked_admits_the_earliest_ttft_deadline_first(vloop):
    """A burst placed at once: the tight task's prompt starts before the loose one's that came
    first; one past its deadline waits for both (as FCFS, the first would have)."""
    model = StepTimeModel(1e-3, 1e-5, 0.0, 1e-3, 0.0, 1e-4)
    engine, ex = make_engine(num_blocks=256, planner="deadline-chunked", step_model=model,
                             max_num_seqs=1)
    engine.add_request(seq("loose", 40, 1, tpot=1.0, prefill_deadline=5.0))
    engine.add_request(seq("late", 40, 1, tpot=0.5, prefill_deadline=-1.0))
    engine.add_request(seq("tight", 40, 1, tpot=0.5, prefill_deadline=0.5))

    async def scenario():
        for _ in range(3):
            await engine.step()

    vloop.run_until_complete(scenario())
    assert ex.plans[:3] == [{"tight": 40}, {"loose": 40}, {"late": 40}]
