# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``least-loaded``: at arrival, the accepting instance with the fewest outstanding tokens.

Load is the control plane's live tally of prompt + max tokens dispatched to an instance and not
yet finished (a least-work router); ties go to the lower KV usage in the latest Monitor
snapshot, then to the lower id.
"""

from __future__ import annotations

from hfx.policies.base import (
    ArrivalOrderPolicy,
    ClusterView,
    Decision,
    Dispatch,
    InstanceView,
)
from hfx.request import Request


def place(req: Request, targets: list[InstanceView], placed: dict[int, int]) -> InstanceView:
    """The instance of ``targets`` with the fewest outstanding tokens, counting ``placed`` (the
    tokens this call has sent each already, so that a burst spreads out; ``req``'s are added);
    ties to the lower KV usage, then the lower id."""
    inst = min(targets, key=lambda i: (i.outstanding_tokens + placed.get(i.id, 0),
                                       i.stats.kv_usage, i.id))
    placed[inst.id] = placed.get(inst.id, 0) + req.prompt_len + req.max_tokens
    return inst


class LeastLoaded(ArrivalOrderPolicy):
    name = "least-loaded"

    def __init__(self) -> None:
        super().__init__()

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        targets = view.accepting()
        if not targets:
            return decision
        # The control plane updates its tallies when it applies the decision; count this call's
        # own placements meanwhile.
        placed: dict[int, int] = {}
        while self._queue:
            req = self._queue.popleft()
            decision.dispatch.append(Dispatch(req, place(req, targets, placed).id))
        return decision
