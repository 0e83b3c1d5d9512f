"""The prefix cache (hfx/engine/prefix_cache.py, block_manager.py): blocks named by a chained
hash, shared by reference count, kept after their sequences until evicted least recently used,
as vLLM v1 keeps them; and a hit skips the prefill of what it covers, in every planner."""

from __future__ import annotations

import hashlib

import pytest
from conftest import make_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import STEP_MODEL, drain

from hfx.engine import RequestStatus
from hfx.engine.block_manager import BlockManager
from hfx.engine.prefix_cache import chain, token_block_hashes, unit_tokens
from hfx.engine.sequence import Sequence


def hashed(rid: str, content: list[int], out: int = 2, hash_block: int = 4,
           prompt: int | None = None) -> Sequence:
    """A sequence whose prompt is ``prompt`` tokens (default: all of ``content``'s blocks)
    named by ``content``, one hash per ``hash_block`` tokens."""
    n = prompt if prompt is not None else len(content) * hash_block
    return Sequence(rid, n, out, block_hashes=tuple(content), hash_block=hash_block)


def admit(kv: BlockManager, s: Sequence, reserve: int = 0) -> bool:
    """What a planner does for a waiting sequence: its cached prefix, then its whole prompt."""
    cached = kv.cached_prefix(s)
    ok = kv.allocate(s, s.num_tokens, reserve, cached)
    if ok:
        kv.note_admission(s)
    return ok


def done(kv: BlockManager, s: Sequence) -> None:
    """The sequence (admitted here if it was not) computed its prompt and leaves."""
    if not s.num_blocks:
        assert admit(kv, s)
    s.num_computed_tokens = s.num_tokens
    kv.free(s)


# ---- naming ------------------------------------------------------------------------------------
def test_a_unit_is_named_by_its_whole_prefix():
    a = chain([1, 2, 3], 1, 0)
    b = chain([9, 2, 3], 1, 0)
    assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2]  # one different block: all differ
    assert chain([1, 2, 3, 4], 2, 0) == [hash((0, 1, 2)), hash((hash((0, 1, 2)), 3, 4))]
    assert chain([1, 2, 3], 2, 0) == chain([1, 2], 2, 0)  # only whole units


def test_unit_size_is_the_span_both_granularities_divide():
    assert unit_tokens(512, 16) == 512  # Mooncake's hash on 16-token blocks: 32 blocks a unit
    assert unit_tokens(16, 16) == 16
    assert unit_tokens(16, 64) == 64
    assert unit_tokens(24, 16) == 48


def test_token_hashes_are_stable_and_per_full_block():
    h = token_block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(h) == 2 and h == token_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    assert h[0] != token_block_hashes([1, 2, 3, 5], 4)[0]
    # blake2b of the little-endian ids: the same in every process and version (records keep it).
    digest = hashlib.blake2b(bytes([1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]),
                             digest_size=8).digest()
    assert h[0] == int.from_bytes(digest, "little") >> 1


# ---- sharing, reference counts, eviction ---------------------------------------------------------
def test_a_shared_prefix_is_held_once_and_counted_as_computed():
    kv = BlockManager(32, 4)
    a = hashed("a", [1, 2, 3, 4, 5])  # 20 tokens, 5 blocks
    assert admit(kv, a) and a.num_computed_tokens == 0
    b = hashed("b", [1, 2, 3, 9], out=1)  # shares 3 blocks
    assert kv.cached_prefix(b) == 12
    assert admit(kv, b)
    assert b.num_computed_tokens == 12 and b.num_cached_tokens == 12
    assert b.block_table[:3] == a.block_table[:3]  # the same KV, not a copy
    assert kv.num_free_blocks == 32 - 5 - 1  # b took one block of its own
    assert [u.refs for u in a.units] == [2, 2, 2, 1, 1]
    assert (kv.queried_tokens, kv.hit_tokens) == (20 + 16, 12)
    assert kv.hits == [("b", 12)]


def test_a_hit_leaves_at_least_one_token_to_compute():
    kv = BlockManager(32, 4)
    done(kv, a := hashed("a", [1, 2, 3]))
    assert a.num_blocks == 0
    again = hashed("again", [1, 2, 3])  # the same 12 tokens: the last unit is computed again
    assert kv.cached_prefix(again) == 8


def test_freed_units_stay_cached_and_count_free_until_evicted_least_recent_first():
    kv = BlockManager(8, 4)
    done(kv, hashed("a", [1, 2, 3]))  # 3 units
    done(kv, hashed("b", [7, 8]))  # 2 units, freed later
    assert kv.num_free_blocks == 8 and kv.evictable_blocks == 5
    # 5 blocks of new content: 3 never-cached blocks, then 2 evicted: a's, tail first.
    assert kv.allocate(Sequence("c", 20, 1), 20)
    assert kv.evicted_units == 2
    assert kv.cached_prefix(hashed("a2", [1, 2, 3, 4])) == 4  # a's head survived its tail
    assert kv.cached_prefix(hashed("b2", [7, 8, 9])) == 8  # b, freed later, is whole


def test_the_free_queue_is_one_lru_order_cached_or_not_as_vllms():
    """vLLM's free block queue: a cached unit freed before other blocks is taken (evicted)
    before them, even when those hold nothing cached."""
    kv = BlockManager(4, 4)
    done(kv, hashed("a", [1, 2]))  # 2 units cached and free; 2 blocks never used
    p = Sequence("p", 8, 1)  # no content: takes the 2 never-used blocks, frees them later
    assert kv.allocate(p, 8)
    kv.free(p)
    assert kv.num_free_blocks == 4 and kv.evictable_blocks == 2
    # One block: the head of the queue is a's tail unit (freed first), not p's blocks.
    assert kv.allocate(Sequence("q", 4, 1), 4)
    assert kv.evicted_units == 1
    assert kv.cached_prefix(hashed("a2", [1, 2, 3])) == 4  # its head is left


def test_blocks_a_running_sequence_holds_are_never_evicted():
    kv = BlockManager(6, 4)
    a = hashed("a", [1, 2, 3, 4])
    assert admit(kv, a)
    a.num_computed_tokens = 16
    # 4 blocks held, 2 free: a request for 3 cannot have a's.
    assert not kv.allocate(Sequence("big", 12, 1), 12)
    assert kv.evicted_units == 0 and [u.refs for u in a.units] == [1, 1, 1, 1]
    assert kv.allocate(Sequence("fits", 8, 1), 8)


def test_a_hit_on_evictable_units_needs_them_free_and_takes_them_out_of_the_free_count():
    kv = BlockManager(6, 4)
    done(kv, hashed("a", [1, 2, 3, 4]))
    assert kv.num_free_blocks == 6 and kv.evictable_blocks == 4
    b = hashed("b", [1, 2, 3, 4, 5])  # 4 units cached, 1 new block
    assert kv.cached_prefix(b) == 16
    assert not admit(kv, b, reserve=2)  # 4 revived + 1 new + 2 reserve > 6: nothing changes
    assert kv.num_free_blocks == 6 and b.num_blocks == 0 and b.num_computed_tokens == 0
    assert kv.evictable_blocks == 4
    assert admit(kv, b)
    assert kv.num_free_blocks == 6 - 4 - 1 and kv.evictable_blocks == 0


def test_a_unit_computed_twice_stays_the_second_sequences_own():
    """Two sequences that compute the same content at once: the first caches it, the second
    keeps its copy uncached (as vLLM keeps a duplicate block) and frees it with itself."""
    kv = BlockManager(16, 4)
    a, b = hashed("a", [1, 2, 3]), hashed("b", [1, 2, 3])
    assert admit(kv, a) and admit(kv, b)
    assert b.num_computed_tokens == 8  # a offered its prompt's units as it was planned
    c, d = hashed("c", [5, 6, 7]), hashed("d", [5, 6, 7])
    assert kv.cached_prefix(c) == kv.cached_prefix(d) == 0
    assert kv.allocate(c, 12) and kv.allocate(d, 12)  # both planned before either offered
    assert len(c.units) == 3 and d.units == []
    used = kv.num_used_blocks
    done(kv, d)
    assert kv.num_used_blocks == used - 3 and kv.evictable_blocks == 0


def test_preemption_keeps_the_counts_and_recompute_hits_what_it_computed():
    kv = BlockManager(16, 4)
    a = hashed("a", [1, 2, 3, 4], out=8)
    assert admit(kv, a)
    a.num_computed_tokens = 16
    kv.free(a)  # preempted: as BatchPlanner.preempt frees it
    a.num_computed_tokens = 0
    a.num_preemptions = 1
    assert kv.num_free_blocks == 16 and kv.evictable_blocks == 4
    assert kv.cached_prefix(a) == 12
    assert admit(kv, a)
    assert a.num_computed_tokens == 12 and kv.queried_tokens == 16  # counted once
    assert a.num_cached_tokens == 0  # its first admission found nothing


def test_a_failed_step_does_not_cache_what_it_may_not_have_written():
    kv = BlockManager(16, 4)
    a = hashed("a", [1, 2, 3])
    assert admit(kv, a)
    kv.free(a, computed=False)
    assert kv.num_free_blocks == 16 and kv.evictable_blocks == 0
    assert kv.cached_prefix(hashed("b", [1, 2, 3, 4])) == 0


def test_prefix_caching_off_finds_nothing():
    kv = BlockManager(16, 4, prefix_caching=False)
    done(kv, hashed("a", [1, 2, 3]))
    assert kv.cached_prefix(hashed("b", [1, 2, 3, 4])) == 0
    assert kv.evictable_blocks == 0


def test_hashes_coarser_than_a_block_cache_whole_units():
    """Mooncake's 512-token hashes on 16-token blocks: a unit is 32 blocks, and a prompt's
    tail past its last full unit is not cached."""
    kv = BlockManager(200, 16)
    a = Sequence("a", 1300, 1, block_hashes=(1, 2, 3), hash_block=512)
    assert admit(kv, a)
    assert [u.blocks for u in a.units] == [32, 32]  # 1,024 of 1,300 tokens
    b = Sequence("b", 1100, 1, block_hashes=(1, 2, 9), hash_block=512)
    assert kv.cached_prefix(b) == 1024


@settings(max_examples=150, deadline=None)
@given(program=st.lists(st.tuples(st.sampled_from(["admit", "free"]), st.integers(0, 5),
                                   st.lists(st.integers(0, 2), min_size=1, max_size=6)),
                        max_size=60),
       ids=st.booleans())
def test_blocks_are_conserved_with_sharing(program, ids):
    """Whatever is admitted and freed: every block is free, evictable or held; a cached unit's
    count is the number of sequences holding it; with ids, a block held by two sequences is
    a cached unit's."""
    kv = BlockManager(20, 2, block_ids=ids)
    seqs: dict[int, Sequence] = {}
    for op, i, content in program:
        if op == "admit" and i not in seqs:
            s = hashed(str(i), content, hash_block=2)
            if admit(kv, s):
                seqs[i] = s
        elif op == "free" and i in seqs:
            done(kv, seqs.pop(i))
        holders: dict[int, int] = {}
        for s in seqs.values():
            for u in s.units:
                holders[id(u)] = holders.get(id(u), 0) + 1
            assert s.num_blocks >= sum(u.blocks for u in s.units)
        units = {id(u): u for s in seqs.values() for u in s.units}
        assert all(u.refs == holders[k] for k, u in units.items())
        shared = sum(u.blocks for u in units.values())
        private = sum(s.num_blocks - sum(u.blocks for u in s.units) for s in seqs.values())
        assert kv.num_free_blocks + shared + private == kv.num_blocks
        assert 0 <= kv.evictable_blocks <= kv.num_free_blocks
        if ids:
            held = [b for s in seqs.values() for b in s.block_table]
            unit_ids = {b for u in units.values() for b in u.ids or ()}
            assert all(held.count(b) == 1 for b in held if b not in unit_ids)
            assert len(set(held)) + kv.num_free_blocks == kv.num_blocks
    for s in list(seqs.values()):
        done(kv, s)
    assert kv.num_free_blocks == kv.num_blocks


# ---- the engine: a hit skips the prefill of what it covers ---------------------------------------
PLANNERS = ["prefill-first", "chunked", "tpot-chunked", "deadline-chunked", "slo-paced",
            "credit"]


@pytest.mark.parametrize("planner", PLANNERS)
def test_a_cached_prefix_is_not_computed_again(vloop, planner):
    engine, ex = make_engine(planner=planner, step_model=STEP_MODEL)
    engine.add_request(hashed("a", [1, 2, 3, 4, 5, 6], out=2))  # 24 tokens
    vloop.run_until_complete(drain(engine))
    # Shares 4 blocks (16 tokens), then 2 of its own: 8 tokens to compute.
    b = hashed("b", [1, 2, 3, 4, 8, 9], out=2)
    engine.add_request(b)
    _, transitions = vloop.run_until_complete(drain(engine))
    assert ex.plans[-2:] == [{"b": 8}, {"b": 1}]
    assert b.num_cached_tokens == 16 and transitions == [("b", RequestStatus.FINISHED_LENGTH)]
    assert engine.kv.num_free_blocks == engine.kv.num_blocks  # all free, some cached
    assert (engine.kv.queried_tokens, engine.kv.hit_tokens) == (48, 16)


def test_the_step_with_a_hit_reports_it_and_is_charged_for_the_uncached_part(vloop):
    engine, _ = make_engine(planner="chunked")
    engine.add_request(hashed("a", [1, 2, 3, 4], out=1))
    vloop.run_until_complete(drain(engine))
    engine.add_request(hashed("b", [1, 2, 3, 7], out=1))

    async def one_step():
        planned = engine.begin_step(vloop)
        # 4 new tokens attending over 12 cached: Σ c·(k + c) = 4·16.
        assert planned.out.shape.prefill_tokens == 4 and planned.out.shape.prefill_sq == 4 * 16
        return engine.end_step(planned, None)

    assert vloop.run_until_complete(one_step()).cached == [("b", 12)]


def test_without_prefix_caching_every_prompt_is_computed_whole(vloop):
    engine, ex = make_engine(planner="chunked", prefix_caching=False)
    engine.add_request(hashed("a", [1, 2, 3, 4], out=1))
    vloop.run_until_complete(drain(engine))
    engine.add_request(hashed("b", [1, 2, 3, 7], out=1))
    vloop.run_until_complete(drain(engine))
    assert ex.plans == [{"a": 16}, {"b": 16}]


def test_an_answer_is_cached_for_the_next_turn(vloop):
    """Hashes that go on over the output: the finished turn's answer is cached, and the next
    turn (history + answer + a new message) computes only its new message."""
    engine, ex = make_engine(planner="chunked")
    turn1 = hashed("t1", [1, 2, 3, 4], out=9, prompt=12)  # 12 prompt + 9 answer tokens
    engine.add_request(turn1)
    vloop.run_until_complete(drain(engine))
    # 20 of its 21 tokens have KV (the last sampled one has none): units 1-5 of 4 tokens.
    turn2 = hashed("t2", [1, 2, 3, 4, 5, 6, 7], out=1)  # 28 tokens: the history, then new
    engine.add_request(turn2)
    vloop.run_until_complete(drain(engine))
    assert turn2.num_cached_tokens == 16 and ex.plans[-1] == {"t2": 12}


def test_preemption_under_pressure_with_shared_prefixes_loses_nothing(vloop):
    engine, _ = make_engine(num_blocks=24, planner="chunked", max_num_batched_tokens=16)
    for i in range(6):
        engine.add_request(hashed(f"r{i}", [1, 2, i + 10, i + 20], out=12))
    tokens, _ = vloop.run_until_complete(drain(engine))
    assert {k: len(v) for k, v in tokens.items()} == {f"r{i}": 12 for i in range(6)}
    assert engine.num_preemptions > 0
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert all(u.refs == 0 for u in engine.kv._cached.values())


# ---- the simulator: stepping and decode runs agree with hits too --------------------------------
@pytest.mark.parametrize("fields", [
    {"policy": "rr", "workload": "shared-prompts", "qps": 3, "duration": 60.0,
     "kv_capacity_tokens": 80_000},
    {"policy": "hfx", "workload": "agent-loops", "qps": 1.0, "duration": 120.0,
     "kv_capacity_tokens": 100_000},
], ids=["prefill-first", "deadline-chunked"])
def test_decode_runs_give_the_results_of_stepping_with_prefix_hits(fields):
    """The decode cohort and its runs (cohort.py, decode_run.py) take their blocks in counts;
    the prefix cache's offers and evictions must not tell them apart from stepping."""
    from hfx.config import SimConfig
    from hfx.sim.driver import simulate

    def result(engine_runs: bool) -> dict:
        r = simulate(SimConfig(**fields, engine_runs=engine_runs))
        return {k: v for k, v in r.items() if k not in ("wall_seconds", "config")}

    on = result(True)
    assert on["hit_rate"] > 0.3 and any(c["evicted_units"] for c in
                                        on["per_instance_cache"].values())
    assert result(False) == on
