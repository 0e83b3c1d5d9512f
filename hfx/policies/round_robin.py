"""``rr``: round robin at arrival (the seeds' "RR", Llumnix with round-robin dispatch;
seed 000 §7.4). Every request goes to the next accepting instance the moment it arrives."""

from __future__ import annotations

from collections import deque

from hfx.policies.base import ClusterView, Decision, Dispatch, Policy
from hfx.request import Request


class RoundRobin(Policy):
    name = "rr"

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()
        self._next = 0

    def enqueue(self, request: Request, now: float) -> None:
        self._queue.append(request)

    def num_queued(self) -> int:
        return len(self._queue)

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        targets = view.accepting()
        if not targets:
            return decision
        while self._queue:
            inst = targets[self._next % len(targets)]
            self._next += 1
            decision.dispatch.append(Dispatch(self._queue.popleft(), inst.id))
        return decision
