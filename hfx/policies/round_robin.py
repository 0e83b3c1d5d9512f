# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``rr``: round robin at arrival (the seeds' "RR", Llumnix with round-robin dispatch;
HyperFlexis §7.4). Every request goes to the next accepting instance the moment it arrives."""

from __future__ import annotations

from hfx.policies.base import ArrivalOrderPolicy, ClusterView, Decision, Dispatch


class RoundRobin(ArrivalOrderPolicy):
    name = "rr"

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

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
