# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Calendars of ticks: which members of a decode cohort have an event due at which tick.

The cohort's ticks count up by one, and an event (a block crossing, a finish) is due at a tick
not yet taken, so a list per tick replaces a heap: an event costs one append and one pop, with
no sifting and no tuple per entry. A sequence has at most one event of a kind due, kept on the
sequence itself (``Sequence.cross_due``, ``Sequence.finish_due``); a listing whose sequence's
due moved (it left, or left and came back) is stale and skipped.
"""

from __future__ import annotations

import heapq

from hfx.engine.sequence import NO_EVENT, Sequence


class TickCalendar:
    """One kind of event; subclasses name the sequence's field that holds it."""

    __slots__ = ("_at", "_from", "_ticks")

    def __init__(self, ordered: bool = False) -> None:
        self._at: dict[int, list[Sequence]] = {}  # tick → the sequences listed there
        self._from = 0  # every tick before it is taken
        # The ticks listed, a heap, kept only for ``first`` (``ordered``).
        self._ticks: list[int] | None = [] if ordered else None

    def due(self, seq: Sequence) -> int:
        raise NotImplementedError

    def set_due(self, seq: Sequence, tick: int) -> None:
        raise NotImplementedError

    def put(self, seq: Sequence, tick: int) -> None:
        """``seq``'s event is due at ``tick`` (replacing any it had). A tick already taken
        waits at the first one not taken."""
        self.set_due(seq, tick)
        at = tick if tick > self._from else self._from
        listed = self._at.get(at)
        if listed is None:
            self._at[at] = [seq]
            if self._ticks is not None:
                heapq.heappush(self._ticks, at)
        else:
            listed.append(seq)

    def drop(self, seq: Sequence) -> None:
        """``seq`` has no event due any more (it left the cohort)."""
        self.set_due(seq, NO_EVENT)

    def take(self, tick: int) -> list[Sequence]:
        """The sequences whose event is due by ``tick``, each once, in the order they were put
        (callers sort); their events are dropped."""
        at = self._at
        taken: list[Sequence] = []
        for t in range(self._from, tick + 1):
            listed = at.pop(t, None)
            if listed is not None:
                for seq in listed:
                    if self.due(seq) <= tick:
                        self.set_due(seq, NO_EVENT)  # once, though listed twice
                        taken.append(seq)
        if tick > self._from:
            self._from = tick  # not past it: an event may still be put at this tick
        ticks = self._ticks
        if ticks is not None:
            while ticks and ticks[0] <= tick:
                heapq.heappop(ticks)
        return taken

    def first(self) -> int | None:
        """The earliest tick with an event due (None: none); an ``ordered`` calendar's."""
        ticks, at = self._ticks, self._at
        assert ticks is not None, "first() needs an ordered calendar"
        while ticks:
            t = ticks[0]
            # A live event listed at t is due at t, or before it if it was put late (then it
            # is the earliest: every tick before ``_from`` is taken).
            earliest = NO_EVENT
            for seq in at.get(t, ()):
                d = self.due(seq)
                if d <= t and d < earliest:
                    earliest = d
            if earliest != NO_EVENT:
                return earliest
            heapq.heappop(ticks)  # only stale listings there
            at.pop(t, None)
        return None

    def due_by(self, last: int) -> list[int]:
        """The ticks of the events due by ``last``, sorted (one per sequence)."""
        at = self._at
        found: dict[Sequence, int] = {}
        for t in range(self._from, last + 1):
            for seq in at.get(t, ()):
                d = self.due(seq)
                if d <= last:
                    found[seq] = d
        return sorted(found.values())

    def clear(self) -> None:
        self._at.clear()
        if self._ticks is not None:
            self._ticks.clear()


class Crossings(TickCalendar):
    """Each member's first block crossing (from then on it crosses by phase: cohort.py)."""

    __slots__ = ()

    def due(self, seq: Sequence) -> int:
        return seq.cross_due

    def set_due(self, seq: Sequence, tick: int) -> None:
        seq.cross_due = tick


class Finishes(TickCalendar):
    """Each member's tick of ``max_tokens``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(ordered=True)

    def due(self, seq: Sequence) -> int:
        return seq.finish_due

    def set_due(self, seq: Sequence, tick: int) -> None:
        seq.finish_due = tick
