"""The simulated vLLM scheduler (hfx/engine/planners/vllm.py): a real engine core with a fake
executor, exact plans against what vLLM 0.32's Scheduler.schedule does with
``--scheduling-policy priority``, each beside the ``chunked`` stand-in where they differ."""

from __future__ import annotations

from conftest import make_engine, seq

from hfx.engine import RequestStatus, Role, Sequence
from hfx.engine.planners.vllm import BEST_EFFORT_PRIORITY, vllm_priority


async def steps(engine, n: int) -> None:
    for _ in range(n):
        await engine.step()


def test_priority_is_the_tpot_in_milliseconds_and_best_effort_last():
    assert vllm_priority(0.05, False) == 50
    assert vllm_priority(0.02, False) < vllm_priority(0.1, False)
    assert vllm_priority(0.05, True) == vllm_priority(None, False) == BEST_EFFORT_PRIORITY


def test_waiting_requests_start_by_priority_then_arrival(vloop):
    engine, ex = make_engine(planner="vllm", max_num_batched_tokens=64, max_num_seqs=2)
    for rid, tpot in (("a", 0.1), ("b", 0.02), ("c", None), ("d", 0.02)):
        engine.add_request(seq(rid, 4, 2, tpot=tpot))
    vloop.run_until_complete(steps(engine, 4))
    # Two slots: the 20 ms pair first (b before d, by arrival), then a (100 ms), then c
    # (no SLO: best effort, last).
    assert ex.plans == [{"b": 4, "d": 4}, {"b": 1, "d": 1}, {"a": 4, "c": 4}, {"a": 1, "c": 1}]


def test_kv_shortage_preempts_the_lowest_priority_even_if_scheduled_earlier_in_the_step(vloop):
    plans = {}
    for planner in ("vllm", "chunked"):
        # 5 blocks of 4 tokens: lo (6 + 10 tokens, 200 ms) and hi (4 + 10, 20 ms) outgrow them.
        engine, ex = make_engine(num_blocks=5, block_size=4, planner=planner, watermark=0.0,
                                 max_num_batched_tokens=8)
        engine.add_request(seq("lo", 6, 10, tpot=0.2))
        vloop.run_until_complete(steps(engine, 1))
        engine.add_request(seq("hi", 4, 10, tpot=0.02))
        vloop.run_until_complete(steps(engine, 6))
        plans[planner] = ex.plans
        if planner == "vllm":
            # Step 7: hi needs a third block; lo, first in the running list and scheduled
            # already in this step, is preempted and its token goes back to the budget.
            assert engine.state.waiting[0].request_id == "lo"
            assert engine.state.waiting[0].num_preemptions == 1
    head = [{"lo": 6}, {"lo": 1, "hi": 4}, *[{"lo": 1, "hi": 1}] * 4]
    assert plans["vllm"] == [*head, {"hi": 1}]
    assert plans["chunked"] == [*head, {"lo": 1}]  # FCFS's victim: the newest, hi


def test_a_preempted_request_goes_back_by_its_priority_not_to_the_front(vloop):
    engine, ex = make_engine(num_blocks=5, block_size=4, planner="vllm", watermark=0.0,
                             max_num_batched_tokens=8)
    engine.add_request(seq("lo", 6, 10, tpot=0.2))
    vloop.run_until_complete(steps(engine, 1))
    engine.add_request(seq("hi", 4, 10, tpot=0.02))
    vloop.run_until_complete(steps(engine, 6))  # lo preempted (the test above)
    engine.add_request(seq("mid", 4, 1, tpot=0.1))
    waiting = [s.request_id for s in engine.state.waiting]
    assert waiting == ["mid", "lo"]  # 100 ms before 200 ms, though lo arrived first
    vloop.run_until_complete(steps(engine, 20))
    later = ex.plans[7:]
    first = {rid: next(i for i, p in enumerate(later) if rid in p) for rid in ("mid", "lo")}
    assert first["mid"] < first["lo"]  # lo's recompute after mid
    assert not engine.has_work()


def test_a_request_is_admitted_only_when_its_whole_prompt_fits(vloop):
    plans = {}
    for planner in ("vllm", "chunked"):
        # 5 blocks of 4 tokens: a holds 3 of them to its end (4 + 6 tokens); b's 16-token
        # prompt needs 4.
        engine, ex = make_engine(num_blocks=5, block_size=4, planner=planner, watermark=0.0,
                                 max_num_batched_tokens=4)
        engine.add_request(seq("a", 4, 6, tpot=0.05))
        a = engine.state.waiting[0]
        vloop.run_until_complete(steps(engine, 1))
        b = seq("b", 16, 1, tpot=0.05)
        engine.add_request(b)
        vloop.run_until_complete(steps(engine, 9))
        plans[planner] = ex.plans
        assert a.status is RequestStatus.FINISHED_LENGTH and b.status.finished
    # vLLM (scheduler_reserve_full_isl): b waits for a to finish, then prefills in chunks.
    assert plans["vllm"] == [{"a": 4}, *[{"a": 1}] * 5, *[{"b": 4}] * 4]
    # The stand-in starts b's first chunks beside a, then preempts b when a needs a block.
    assert plans["chunked"][1] == {"a": 1, "b": 3}
    assert b.num_preemptions == 1


def test_a_prefix_hit_skips_the_cached_blocks(vloop):
    engine, ex = make_engine(num_blocks=16, block_size=4, planner="vllm",
                             max_num_batched_tokens=64)
    tokens = list(range(12))
    engine.add_request(seq("a", 12, 1, prompt_token_ids=tokens, tpot=0.05))
    vloop.run_until_complete(steps(engine, 1))
    engine.add_request(seq("b", 13, 1, prompt_token_ids=[*tokens, 99], tpot=0.05))
    vloop.run_until_complete(steps(engine, 1))
    assert ex.plans == [{"a": 12}, {"b": 1}]  # 12 tokens, three full blocks, cached
    assert engine.kv.hit_tokens == 12


def test_vllm_fcfs_ignores_priorities(vloop):
    engine, ex = make_engine(planner="vllm-fcfs", max_num_batched_tokens=64, max_num_seqs=2)
    for rid, tpot in (("a", 0.1), ("b", 0.02), ("c", None), ("d", 0.02)):
        engine.add_request(seq(rid, 4, 2, tpot=tpot))
    vloop.run_until_complete(steps(engine, 4))
    assert ex.plans == [{"a": 4, "b": 4}, {"a": 1, "b": 1}, {"c": 4, "d": 4}, {"c": 1, "d": 1}]


def _import(rid: str, tpot: float) -> Sequence:
    s = seq(rid, 4, 12, tpot=tpot)
    s.output_token_ids.append(0)  # prefilled elsewhere, its first token sampled
    s.num_tokens += 1
    s.num_computed_tokens = s.prompt_len
    return s


def test_imports_take_their_place_in_the_arrival_order(vloop):
    """A decode instance's imports never queue: each is numbered as its KV is reserved, so
    vLLM's victims and requeue order, by (priority, arrival), hold for them too. Unnumbered,
    two preempted imports of one priority tied and the queue compared the sequences (a
    TypeError)."""
    # 6 blocks of 4 tokens: three imports of 5 tokens (4 + the sampled one) hold two each.
    engine, _ = make_engine(num_blocks=6, block_size=4, planner="vllm", role=Role.DECODE,
                             watermark=0.0)
    imports = [_import(rid, 0.05) for rid in ("a", "b", "c")]
    for s in imports:
        assert engine.reserve_import(s)
        engine.activate_import(s.request_id)
    assert [s.arrival for s in imports] == [1, 2, 3]
    # Step 5 writes token 9, past two blocks: a needs a third, none is free, and the last to
    # arrive of the one priority is preempted (c). Step 9 writes token 13: a needs a fourth
    # and b goes; it waits before c, which arrived after it.
    vloop.run_until_complete(steps(engine, 5))
    assert [s.request_id for s in engine.state.waiting] == ["c"]
    vloop.run_until_complete(steps(engine, 4))
    assert [s.request_id for s in engine.state.waiting] == ["b", "c"]
    assert [s.num_preemptions for s in imports] == [0, 1, 1]


def test_a_request_that_preempts_itself_first_leaves_the_step_to_the_others(vloop):
    """lo runs first in the running list and is the lowest priority: when it needs a block and
    none is free it is its own victim, and vLLM plans no one after it in that pass. vLLM's
    next iteration plans hi; so does the engine at once (an empty plan here used to end the
    step with work left, and the simulator's instance then idled for good)."""
    # 4 blocks of 4: lo (6 tokens) holds 2, hi (4) 1; hi's first decode takes the last.
    engine, ex = make_engine(num_blocks=4, block_size=4, planner="vllm", watermark=0.0,
                             max_num_batched_tokens=16)

    async def go() -> list[list[str]]:
        engine.add_request(seq("lo", 6, 6, tpot=0.2))
        ran = [(await engine.step()).request_ids]
        engine.add_request(seq("hi", 4, 6, tpot=0.02))
        for _ in range(3):
            ran.append((await engine.step()).request_ids)
        return ran

    # Step 4: lo writes its 9th token, needs a third block and preempts itself; hi decodes.
    assert vloop.run_until_complete(go()) == [["lo"], ["lo", "hi"], ["lo", "hi"], ["hi"]]
    assert ex.plans[-1] == {"hi": 1}
    assert [s.request_id for s in engine.state.waiting] == ["lo"]
    assert engine.num_preemptions == 1
