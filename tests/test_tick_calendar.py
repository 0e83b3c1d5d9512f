"""The decode cohort's calendars of ticks (hfx/engine/tick_calendar.py) against a plain model of
what they keep: each sequence's one due tick."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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
