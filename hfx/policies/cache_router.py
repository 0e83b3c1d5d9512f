"""What the cache-aware routers an operator would put in front of vLLM instead of HFX share
(issue 47; their sources and defaults: docs/peers.md): requests routed at arrival, in order,
to the vLLM engine they front (``chunked``: vLLM v1's scheduler, prefix caching on), with a
seeded tie-break and, for those that learn from routing history, an index of what they routed
where (``PrefixIndex`` in its ``estimate`` mode, bounded as each router bounds its own).
"""

from __future__ import annotations

import random

from hfx.policies.base import ArrivalOrderPolicy, ClusterView, Decision, Dispatch, InstanceView
from hfx.policies.prefix_index import PrefixIndex
from hfx.request import Request


class CacheAwareRouter(ArrivalOrderPolicy):
    planner = "chunked"  # vLLM v1's scheduler: what these routers front

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.routed: PrefixIndex | None = None  # what this router sent where, if it learns it

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        targets = view.accepting()
        if not targets:
            return decision
        # The control plane moves its tallies when it applies the decision: this call's own
        # placements count meanwhile, so that a burst spreads.
        placed: dict[int, int] = {}
        while self._queue:
            req = self._queue.popleft()
            inst = self.pick(req, view, targets, placed)
            placed[inst.id] = placed.get(inst.id, 0) + 1
            decision.dispatch.append(Dispatch(req, inst.id))
            self.remember(req, inst, view)
        return decision

    def pick(self, req: Request, view: ClusterView, targets: list[InstanceView],
             placed: dict[int, int]) -> InstanceView:
        raise NotImplementedError

    def remember(self, req: Request, inst: InstanceView, view: ClusterView) -> None:
        """``req`` goes to ``inst``: a router that learns from its routing remembers it."""
        if self.routed is not None:
            self.routed.routed(inst.id, req)
            self.routed.forget(req.id)

    def learning(self, view: ClusterView, targets: list[InstanceView],
                 capacity: int | None) -> PrefixIndex:
        """The router's index of routed prompts, every target in it: ``capacity`` KV blocks
        an instance (None: each instance's own KV)."""
        if self.routed is None:
            self.routed = PrefixIndex(view.profile.block_size)
        for inst in targets:
            if inst.id not in self.routed.sources:
                self.routed.estimate(inst.id, capacity or inst.stats.kv_total_blocks)
        return self.routed

    def best(self, targets: list[InstanceView], score: dict[int, float]) -> InstanceView:
        """The highest score, ties broken at random (a max-score picker's shuffle)."""
        top = max(score[i.id] for i in targets)
        tied = [i for i in targets if score[i.id] == top]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    @staticmethod
    def load(inst: InstanceView, placed: dict[int, int]) -> int:
        """Requests the router has in flight on ``inst`` (dispatched, not finished)."""
        return inst.outstanding + placed.get(inst.id, 0)
