"""``prefix-aware``: vLLM production-stack's router, ``--routing-logic prefixaware``
(vllm-project/production-stack ``src/vllm_router/routers/routing_logic.py``
``PrefixAwareRouter`` and ``prefix/hashtrie.py`` at a6c01db0): a trie of the prompts it routed,
each node with the endpoints it was routed to, never evicted ("we assume that there is no
eviction of prefix cache"); a request goes to an endpoint chosen at random among those that
share its longest routed prefix, at random among all when none does
(``--prefix-min-match-length`` 0), and its prompt is inserted under it. No load signal.

The trie's chunks are 128 characters of the prompt's text; here they are the prompt's cached
units (16 tokens, ≈ 64 characters; or the request's own hash blocks).
"""

from __future__ import annotations

from hfx.policies.base import ClusterView, InstanceView
from hfx.policies.cache_router import CacheAwareRouter
from hfx.request import Request

NEVER_EVICTED = 1 << 62  # blocks: the trie has no size limit


class PrefixAware(CacheAwareRouter):
    name = "prefix-aware"

    def pick(self, req: Request, view: ClusterView, targets: list[InstanceView],
             placed: dict[int, int]) -> InstanceView:
        cached = self.learning(view, targets, NEVER_EVICTED).match(req)
        longest = max((cached.get(i.id, 0) for i in targets), default=0)
        pool = [i for i in targets if cached.get(i.id, 0) == longest] if longest else targets
        return self.rng.choice(pool)
