# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Q_W, HFX's instances ordered by maturity time (HyperFlexis Algorithm 1).

A heap of (maturity, instance) with lazy deletion: setting a time pushes a new entry and the old
one is skipped when it surfaces. Sorting every instance by maturity on each dispatcher call was
O(N log N) per arrival — the dispatcher's whole cost at 1,000 instances; a call now
pays for the instances it serves.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable


class MaturityQueue:
    def __init__(self) -> None:
        self._time: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []
        self._members: frozenset[int] = frozenset()
        # This round's (one dispatcher call's) served instances, and their entries set during it,
        # kept aside until the round ends rather than popped and pushed again at each pop.
        self._served: set[int] = set()
        self._aside: list[tuple[float, int]] = []

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
        if instance_id not in self._members:
            return
        if instance_id in self._served:
            self._aside.append((time, instance_id))  # not again this round
            return
        heap = self._heap
        if len(heap) > 4 * len(self._members) + 64:  # mostly superseded entries: rebuild
            self._rebuild()
        heapq.heappush(heap, (time, instance_id))

    def members(self, ids: Iterable[int], now: float) -> None:
        """Order these instances from now on (the accepting ones); a new one is mature now."""
        self._members = frozenset(ids)
        self._aside.clear()
        self._served.clear()
        for iid in self._members:
            self._time.setdefault(iid, now)
        self._rebuild()

    def _rebuild(self) -> None:
        """The heap of the members' current entries only (the served ones' wait aside)."""
        heap = self._heap
        heap[:] = [(self._time[i], i) for i in self._members if i not in self._served]
        heapq.heapify(heap)

    def _current(self, entry: tuple[float, int]) -> bool:
        time, iid = entry
        return iid in self._members and self._time[iid] == time

    def pop_mature(self, now: float, order: Callable[[int], float] | None = None,
                   look: int = 8) -> int | None:
        """A member mature by ``now`` not yet served this round, taken off the queue (serving it
        sets its next maturity); None when there is none. The earliest one; with ``order`` (a
        rank >= 0), of the ``look`` earliest mature ones the one ranked least (ties: the
        earliest; one ranked 0 at once, as none can rank below it)."""
        heap, members, times, served = self._heap, self._members, self._time, self._served
        pick: tuple[float, int] | None = None
        best = 0.0
        passed: list[tuple[float, int]] = []  # mature candidates not picked, pushed back
        seen = 0
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            time, iid = entry
            if iid not in members or times[iid] != time:
                continue  # superseded, or no longer a member
            if iid in served:
                self._aside.append(entry)  # pushed before this round served it
                continue
            if order is None:
                pick = entry
                break
            rank = order(iid)
            if pick is None or rank < best:
                if pick is not None:
                    passed.append(pick)
                pick, best = entry, rank
            else:
                passed.append(entry)
            seen += 1
            if best <= 0.0 or seen >= look:
                break
        for entry in passed:
            heapq.heappush(heap, entry)  # still mature, for a later pop this round
        if pick is None:
            return None
        served.add(pick[1])
        return pick[1]

    def ready(self, instance_id: int, now: float) -> bool:
        """Whether a member is mature by ``now`` and not yet served this round."""
        return (instance_id in self._members and instance_id not in self._served
                and self._time[instance_id] <= now)

    def take(self, instance_id: int) -> None:
        """Serve this member this round, out of its turn (its entry is passed over lazily)."""
        self._served.add(instance_id)

    def end_round(self) -> None:
        """The dispatcher call is over: every member may be served again, at the times set
        during it."""
        for entry in self._aside:
            heapq.heappush(self._heap, entry)
        self._aside.clear()
        self._served.clear()

    def earliest(self) -> float | None:
        """The earliest maturity among the members (the round ended)."""
        self.end_round()
        heap = self._heap
        while heap and not self._current(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None
