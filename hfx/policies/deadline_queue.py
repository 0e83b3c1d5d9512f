# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""SCORPIO's per-instance waiting queue (hfx/policies/scorpio.py), in TTFT-deadline order, and
its TTFT guard. Compiled with the engine (hfx/native.py).

In overload SCORPIO walks a queue on almost every arrival, and the queue is as long as the
guard lets it grow (TTFT over a prefill: tens of requests). As a heap, sorted and re-heaped on
every walk, with the guard's passes as Python loops, that walk was ~75% of a 32-instance run's
policy time, and it grew with the backlog, so 10× the requests took 18.5× the wall time
(issue 31). Here the queue stays sorted (an insertion is a bisection), the guard's passes are
compiled loops over it, and a walk rebuilds nothing unless something left.

The order and every comparison are the ones the heap version made: entries sort by
(deadline, arrival, seq), ``seq`` unique, and the guard's float expressions are written the
same way, so decisions are bit-identical (the scorpio goldens, tests/test_golden.py).
"""

from __future__ import annotations

import math
from bisect import bisect_right

from hfx.request import Request


class DeadlineQueue:
    """Waiting requests, least time to TTFT deadline first, each with its predicted prefill."""

    def __init__(self) -> None:
        # Parallel lists, one entry per waiting request; ``_keys`` is what the order is by, and
        # ``_deadlines`` its first field again, which the guard's passes read without a tuple.
        self._keys: list[tuple[float, float, int]] = []
        self._deadlines: list[float] = []
        self._prefills: list[float] = []
        self._requests: list[Request] = []

    def __len__(self) -> int:
        return len(self._keys)

    def push(self, deadline: float, arrival: float, seq: int, prefill: float,
             request: Request) -> None:
        key = (deadline, arrival, seq)
        at = bisect_right(self._keys, key)
        self._keys.insert(at, key)
        self._deadlines.insert(at, deadline)
        self._prefills.insert(at, prefill)
        self._requests.insert(at, request)

    def request(self, k: int) -> Request:
        """The k-th waiting request in deadline order."""
        return self._requests[k]

    def requests(self) -> list[Request]:
        """Every waiting request, in deadline order."""
        return list(self._requests)

    def guard(self, now: float) -> list[Request]:
        """SCORPIO's TTFT guard: walk in deadline order with the predicted prefill of the kept
        requests before each; remove and return (in order) every request that could not start
        its first token by its deadline."""
        deadlines, prefills = self._deadlines, self._prefills
        cum = 0.0
        first = -1
        for k in range(len(deadlines)):
            prefill = prefills[k]
            if now + cum + prefill > deadlines[k]:
                first = k
                break
            cum += prefill
        if first < 0:
            return []  # the common case: nothing leaves, nothing is rebuilt
        rejected: list[Request] = []
        kept: list[int] = list(range(first))
        for k in range(first, len(deadlines)):
            prefill = prefills[k]
            if now + cum + prefill > deadlines[k]:
                rejected.append(self._requests[k])
            else:
                cum += prefill
                kept.append(k)
        self._keep(kept)
        return rejected

    def remove(self, positions: list[int]) -> None:
        """Drop the entries at ``positions`` (ascending): the requests admitted by a walk."""
        if not positions:
            return
        if positions[-1] == len(positions) - 1:  # a prefix, as admissions mostly are
            n = len(positions)
            del self._keys[:n]
            del self._deadlines[:n]
            del self._prefills[:n]
            del self._requests[:n]
            return
        gone = set(positions)
        self._keep([k for k in range(len(self._keys)) if k not in gone])

    def withdraw(self, request_id: str) -> bool:
        for k, req in enumerate(self._requests):
            if req.id == request_id:
                del self._keys[k]
                del self._deadlines[k]
                del self._prefills[k]
                del self._requests[k]
                return True
        return False

    def reject_at(self) -> float:
        """When the guard will next reject, nothing else changing: the least of deadline less
        the prefills up to and including each request (inf when empty)."""
        deadlines, prefills = self._deadlines, self._prefills
        cum, at = 0.0, math.inf
        for k in range(len(deadlines)):
            cum += prefills[k]
            if deadlines[k] - cum < at:
                at = deadlines[k] - cum
        return at

    def _keep(self, kept: list[int]) -> None:
        self._keys = [self._keys[k] for k in kept]
        self._deadlines = [self._deadlines[k] for k in kept]
        self._prefills = [self._prefills[k] for k in kept]
        self._requests = [self._requests[k] for k in kept]
