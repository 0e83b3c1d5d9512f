"""Property-based tests of the KV block manager (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hfx.engine import Sequence
from hfx.engine.block_manager import BlockManager

ops = st.lists(st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 7),
                         st.integers(1, 40)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 24), block_size=st.integers(1, 8), program=ops)
def test_blocks_are_conserved_and_never_shared(num_blocks, block_size, program):
    """With block ids (a real executor's engine) and without (the simulator's), every
    operation decides alike and leaves the same counts; with ids, each held block is in
    exactly one table, and each table as long as its count."""
    kv = BlockManager(num_blocks, block_size)
    counted = BlockManager(num_blocks, block_size, block_ids=False)
    seqs = [Sequence(request_id=str(i), prompt_len=1, max_tokens=1) for i in range(8)]
    twins = [Sequence(request_id=str(i), prompt_len=1, max_tokens=1) for i in range(8)]
    wanted = [0] * 8
    for op, i, n in program:
        s, twin = seqs[i], twins[i]
        if op == "grow":
            before = list(s.block_table)
            ok = kv.allocate(s, wanted[i] + n)
            assert counted.allocate(twin, wanted[i] + n) is ok
            if not ok:
                assert s.block_table == before  # all or nothing
                assert kv.blocks_needed(s, wanted[i] + n) > kv.num_free_blocks
            else:
                wanted[i] += n
                assert len(s.block_table) == s.num_blocks == kv.blocks_for(wanted[i])
        else:
            kv.free(s)
            counted.free(twin)
            wanted[i] = 0
            assert s.block_table == [] and s.num_blocks == 0
        assert [t.num_blocks for t in twins] == [q.num_blocks for q in seqs]
        assert all(t.block_table == [] for t in twins)  # no ids kept
        assert counted.num_free_blocks == kv.num_free_blocks
        owned = [b for q in seqs for b in q.block_table]
        assert len(owned) == len(set(owned))  # no block in two tables
        assert len(owned) + kv.num_free_blocks == num_blocks  # nothing lost or invented
        assert 0 <= kv.num_used_blocks <= num_blocks
        assert all(0 <= b < num_blocks for b in owned)


@given(st.integers(1, 64), st.integers(0, 64))
def test_reserve_keeps_blocks_free(num_blocks, reserve):
    kv = BlockManager(num_blocks, 1)
    s = Sequence(request_id="a", prompt_len=1, max_tokens=1)
    got = kv.allocate(s, num_blocks, reserve=reserve)
    assert got is (reserve == 0)
    if not got:
        assert kv.num_free_blocks == num_blocks and s.num_blocks == 0


def test_freed_blocks_are_reused_first_then_the_lowest_never_used():
    kv = BlockManager(10, 1)
    a, b, c = (Sequence(request_id=r, prompt_len=1, max_tokens=1) for r in "abc")
    assert kv.allocate(a, 3) and a.block_table == [2, 1, 0]  # the end of [9, ..., 0]
    assert kv.allocate(b, 2) and b.block_table == [4, 3]
    kv.free(a)  # [9, ..., 5] + [0, 1, 2]
    assert kv.num_free_blocks == 8
    assert kv.allocate(c, 2) and c.block_table == [1, 2]
    assert kv.allocate(c, 4) and c.block_table == [1, 2, 5, 0]  # a never-used one, then a freed
    assert kv.num_free_blocks == 4 and kv.num_used_blocks == 6
    assert not kv.allocate(a, 5) and a.block_table == [] and a.num_blocks == 0


def test_take_counts_blocks_out_only_when_all_are_free_and_never_with_ids():
    kv = BlockManager(5, 4, block_ids=False)
    assert kv.take(3) and kv.num_free_blocks == 2
    assert not kv.take(3) and kv.num_free_blocks == 2  # all or nothing
    assert kv.take(2) and kv.num_free_blocks == 0 and kv.num_used_blocks == 5
    with pytest.raises(AssertionError):  # ids go to a sequence, not a count
        BlockManager(5, 4).take(1)
