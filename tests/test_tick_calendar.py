"""The decode cohort's calendars of ticks (hfx/engine/tick_calendar.py) against a plain model of
what they keep, each sequence's one due tick; and its crossings counted by phase
(hfx/engine/cohort.py) against a per-member count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hfx.engine.block_manager import BlockManager
from hfx.engine.cohort import DecodeCohort
from hfx.engine.sequence import Sequence
from hfx.engine.tick_calendar import Crossings, Finishes


def _seqs(n: int) -> list[Sequence]:
    return [Sequence(f"r{i}", prompt_len=4, max_tokens=8) for i in range(n)]


def test_take_gives_each_due_sequence_once_and_leaves_the_later_ones():
    a, b, c = _seqs(3)
    cal = Finishes()
    cal.put(a, 3)
    cal.put(b, 5)
    cal.put(c, 3)
    assert cal.first() == 3
    assert cal.take(2) == []
    assert cal.take(3) == [a, c]
    assert cal.take(3) == []
    assert cal.first() == 5
    assert cal.take(6) == [b]
    assert cal.first() is None


def test_a_moved_or_dropped_event_is_not_taken_where_it_was_listed():
    a, b = _seqs(2)
    cal = Finishes()
    cal.put(a, 2)
    cal.put(a, 4)  # moved: its listing at 2 is stale
    cal.put(b, 3)
    cal.drop(b)
    assert cal.first() == 4
    assert cal.take(3) == []
    cal.put(a, 4)  # listed twice at 4 now, due once
    assert cal.take(4) == [a]


def test_an_event_put_at_a_tick_already_taken_is_due_at_the_next_take():
    a, b = _seqs(2)
    cal = Crossings()
    cal.put(a, 5)
    assert cal.take(5) == [a]
    cal.put(b, 4)  # late: tick 4 is past
    cal.put(a, 5)  # at the tick just taken: not past, a member may join due then
    assert cal.due_by(5) == [4, 5]
    assert sorted(s.request_id for s in cal.take(5)) == ["r0", "r1"]


_OPS = st.lists(st.tuples(st.sampled_from(["put", "drop", "take", "first", "due_by"]),
                          st.integers(0, 5), st.integers(-2, 6)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS, ordered=st.booleans())
def test_calendars_keep_what_a_dict_of_due_ticks_keeps(ops, ordered):
    """Ticks only move forward (the cohort's counter); events are put at any tick, late ones
    too. Every answer equals the model's."""
    seqs = _seqs(6)
    cal = Finishes() if ordered else Crossings()
    model: dict[Sequence, int] = {}
    tick = 0
    for op, i, delta in ops:
        seq = seqs[i]
        if op == "put":
            cal.put(seq, tick + delta)
            model[seq] = tick + delta
        elif op == "drop":
            cal.drop(seq)
            model.pop(seq, None)
        elif op == "take":
            tick += delta > 2  # the next tick, or the same one again
            due = {s for s, d in model.items() if d <= tick}
            taken = cal.take(tick)
            assert len(taken) == len(due) and set(taken) == due
            for s in due:
                del model[s]
        elif op == "first" and ordered:
            assert cal.first() == min(model.values(), default=None)
        elif op == "due_by":
            last = tick + abs(delta)
            assert cal.due_by(last) == sorted(d for d in model.values() if d <= last)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5), prompts=st.lists(st.integers(1, 12), min_size=1, max_size=6),
       spare=st.integers(0, 6), ticks=st.integers(1, 14), late=st.integers(0, 6))
def test_crossings_by_phase_take_the_blocks_a_per_member_count_takes(size, prompts, spare,
                                                                     ticks, late):
    """The cohort's crossings after the first are one count per tick (by phase): the free
    blocks fall by exactly what each member lacks, nothing is listed while they fit, and once
    they do not, the members crossing at that tick are listed (in running-list order) with the
    blocks they hold."""
    seqs = []
    for i, p in enumerate(prompts):
        s = Sequence(f"r{i}", prompt_len=p, max_tokens=100, output_token_ids=[7], order=i)
        seqs.append(s)
    held = sum(-(-s.num_tokens // size) for s in seqs)
    kv = BlockManager(held + spare, size, block_ids=False)
    cohort = DecodeCohort(size, events=False, kv=kv)
    for s in seqs[:len(seqs) - 1 if late else len(seqs)]:
        assert kv.allocate(s, s.num_tokens - 1)  # the prompt's KV: the first token's to come
        cohort.join(s)
    for t in range(ticks):
        if late and t == late:
            s = seqs[-1]  # admitted later: its phase differs from the others'
            if kv.allocate(s, s.num_tokens - 1):
                cohort.join(s)
        members = list(cohort)
        # What each member needs for the KV this tick's decode writes (base + tick tokens).
        lacks = {s: -(-(s.cohort_base + cohort.tick) // size) - cohort.blocks(s)
                 for s in members}
        free = kv.num_free_blocks
        crossing = cohort.crossing()
        if sum(lacks.values()) <= free:
            assert crossing == []
            assert kv.num_free_blocks == free - sum(lacks.values())
            assert all(cohort.blocks(s) == -(-(s.cohort_base + cohort.tick) // size)
                       for s in members)
        else:
            assert crossing == sorted((s for s in members if lacks[s]), key=lambda s: s.order)
            assert all(s.num_blocks == cohort.blocks(s) and lacks[s] == 1 for s in crossing)
            break  # the planner's part from here (allocate or preempt, then ``crossed``)
        cohort.step()
    for s in list(cohort):
        cohort.leave(s)
        kv.free(s)
    assert kv.num_free_blocks == kv.num_blocks  # every block counted came back
