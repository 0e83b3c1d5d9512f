"""``sglang``: SGLang's model gateway, its ``cache_aware`` policy (sgl-project/sglang
``sgl-router/src/policies/cache_aware.rs`` at b6f20641; defaults from
``py_src/sglang_router/router_args.py``, what ``launch_router`` uses):

- load: the requests the router has in flight on each worker;
- imbalanced, when max load − min load > ``balance_abs_threshold`` (64) and max load >
  ``balance_rel_threshold`` (1.5) × min load: the least loaded worker;
- else the worker holding the longest prefix of the prompt in the router's tree of routed
  prompts, if it covers more than ``cache_threshold`` (0.3) of the prompt; else the worker with
  the smallest tree (the most room);
- the prompt is inserted under the chosen worker.

SGLang matches characters of the prompt's text in a radix tree; here the tree is of the
prompt's cached units (16 tokens, or the request's own hash blocks), so the match rate is
matched tokens / prompt tokens, a little below the character rate (a partial unit does not
count). Its tree keeps up to ``max_tree_size`` = 2^26 characters a worker (≈ 16.7 M tokens at
4 characters a token), least recently used evicted: far beyond any engine's KV.

The smallest tree is the worker whose tree holds the fewest characters (``tenant_char_count``),
and every routed prompt's text goes into it. A prompt the simulator gives no content (no token
ids, no hash blocks: the synthetic task workloads) is text no other prompt shares, so it counts
its whole length there; without it every tree stayed empty and the tie sent each such request
to the first worker until the load thresholds tripped.
"""

from __future__ import annotations

from hfx.policies.base import ClusterView, InstanceView
from hfx.policies.cache_router import CacheAwareRouter
from hfx.policies.prefix_index import PrefixIndex
from hfx.request import Request

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
MAX_TREE_TOKENS = 2 ** 26 // 4  # max_tree_size characters at 4 characters a token


class SGLangCacheAware(CacheAwareRouter):
    name = "sglang"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        # Each worker's tree size from prompts without content, in the index's blocks: text
        # no other prompt shares, so it only grows (to the tree's bound).
        self._unshared: dict[int, float] = {}

    def tree_size(self, tree: PrefixIndex, inst: InstanceView) -> float:
        return tree.units_held(inst.id) + self._unshared.get(inst.id, 0.0)

    def pick(self, req: Request, view: ClusterView, targets: list[InstanceView],
             placed: dict[int, int]) -> InstanceView:
        tree = self.learning(view, targets, MAX_TREE_TOKENS // view.profile.block_size)
        loads = [self.load(i, placed) for i in targets]
        low, high = min(loads), max(loads)
        if high - low > BALANCE_ABS_THRESHOLD and high > BALANCE_REL_THRESHOLD * low:
            return targets[loads.index(low)]  # min_by_key: the first least loaded
        cached = tree.match(req)
        live = {i.id: i for i in targets}
        longest = max((n for iid, n in cached.items() if iid in live), default=0)
        if longest / req.prompt_len > CACHE_THRESHOLD:
            return next(i for i in targets if cached.get(i.id, 0) == longest)
        return min(targets, key=lambda i: self.tree_size(tree, i))  # the smallest tree

    def remember(self, req: Request, inst: InstanceView, view: ClusterView) -> None:
        super().remember(req, inst, view)
        if req.block_hashes is None and req.prompt_token_ids is None:
            block = view.profile.block_size
            self._unshared[inst.id] = min(MAX_TREE_TOKENS / block,
                                          self._unshared.get(inst.id, 0.0) + req.prompt_len / block)
