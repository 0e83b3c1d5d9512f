# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Q_W, HFX's instances ordered by maturity time (HyperFlexis Algorithm 1).

A heap of (maturity, instance) with lazy deletion: setting a time pushes a new entry and the old
one is skipped when it surfaces. Sorting every instance by maturity on each dispatcher call was
O(N log N) per arrival — the dispatcher's whole cost at 1,000 instances; a call now
pays for the instances it serves.
"""

from __future__ import annotations

import builtins  # set[int] in the class body: its set() method shadows the builtin
import heapq
from collections.abc import Iterable


class MaturityQueue:
    def __init__(self) -> None:
        self._time: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []
        self._members: frozenset[int] = frozenset()

    def __getitem__(self, instance_id: int) -> float:
        return self._time[instance_id]

    def __contains__(self, instance_id: int) -> bool:
        """Whether the instance is one of those ordered (an accepting one)."""
        return instance_id in self._members

    def member_time(self, instance_id: int) -> float | None:
        """A member's maturity; None for an instance that is not one."""
        return self._time[instance_id] if instance_id in self._members else None

    def set(self, instance_id: int, time: float) -> None:
        self._time[instance_id] = time
        if instance_id in self._members:
            heapq.heappush(self._heap, (time, instance_id))

    def members(self, ids: Iterable[int], now: float) -> None:
        """Order these instances from now on (the accepting ones); a new one is mature now."""
        self._members = frozenset(ids)
        for iid in self._members:
            self._time.setdefault(iid, now)
        self._heap = [(self._time[i], i) for i in self._members]
        heapq.heapify(self._heap)

    def _current(self, entry: tuple[float, int]) -> bool:
        time, iid = entry
        return iid in self._members and self._time[iid] == time

    def pop_mature(self, now: float, served: builtins.set[int]) -> int | None:
        """The earliest member mature by ``now`` and not in ``served``, taken off the queue
        (serving it sets its next maturity); None when there is none. Entries of ``served``
        instances set during this call stay for the next one."""
        heap, kept = self._heap, []
        found = None
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if not self._current(entry):
                continue  # superseded, or no longer a member
            if entry[1] in served:
                kept.append(entry)
                continue
            found = entry[1]
            break
        for entry in kept:
            heapq.heappush(heap, entry)
        return found

    def earliest(self) -> float | None:
        """The earliest maturity among the members."""
        heap = self._heap
        while heap and not self._current(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None
