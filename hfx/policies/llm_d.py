"""``llm-d``: llm-d's inference scheduler, its default scheduling profile (Gateway API
Inference Extension EPP; llm-d/llm-d-inference-scheduler ``pkg/epp/config/loader/defaults.go``
at 520af478): no filters; the prefix-cache (weight 3), queue (2) and KV-cache-utilization (2)
scorers, each in [0, 1], summed with their weights; the max-score picker, ties at random.

- prefix-cache scorer: matched blocks / the prompt's blocks, at most 256 blocks of 64
  characters (≈ 16 tokens each at 4 characters a token: the first 4,096 tokens). Its default
  ``approx`` producer learns from its own routing: each routed prompt's blocks go into the
  chosen pod's LRU, sized by the pod's KV blocks (``autoTune``). ``index=precise`` takes the
  instances' own caches instead (the precise scorer, fed by vLLM's KV events; here the control
  plane's index), without the 256-block cap.
- queue scorer: (max W − W) / (max W − min W) over the candidates, 1 for all when equal; W
  the engine's waiting requests. llm-d scrapes it every 50 ms; here the Monitor's running
  count and the live tally of dispatched requests give it between snapshots: W = dispatched
  and not finished − running.
- KV-cache-utilization scorer: 1 − KV usage (the latest snapshot).
"""

from __future__ import annotations

from hfx.policies.base import ClusterView, InstanceView
from hfx.policies.cache_router import CacheAwareRouter
from hfx.request import Request

# pkg/epp/config/loader/defaults.go:46-90
PREFIX_WEIGHT, QUEUE_WEIGHT, KV_WEIGHT = 3.0, 2.0, 2.0
# approximateprefix/types.go:91-142: 256 blocks of 16 tokens (64 characters).
MAX_MATCH_TOKENS = 256 * 16
INDEXES = ("approx", "precise")


class LLMD(CacheAwareRouter):
    name = "llm-d"

    def __init__(self, index: str = "approx", seed: int = 0) -> None:
        if index not in INDEXES:
            raise ValueError(f"index must be one of {INDEXES}, got {index!r}")
        super().__init__(seed)
        self.index = index

    def pick(self, req: Request, view: ClusterView, targets: list[InstanceView],
             placed: dict[int, int]) -> InstanceView:
        if self.index == "approx":
            cached = self.learning(view, targets, None).match(req)
            total = min(req.prompt_len, MAX_MATCH_TOKENS)
        else:
            cached, total = view.cached(req), req.prompt_len
        waiting = {i.id: max(0, self.load(i, placed) - i.stats.num_running) for i in targets}
        low, high = min(waiting.values()), max(waiting.values())
        score = {}
        for inst in targets:
            prefix = min(cached.get(inst.id, 0), total) / total
            queue = 1.0 if high == low else (high - waiting[inst.id]) / (high - low)
            score[inst.id] = (PREFIX_WEIGHT * prefix + QUEUE_WEIGHT * queue
                              + KV_WEIGHT * (1.0 - inst.stats.kv_usage))
        return self.best(targets, score)

    def remember(self, req: Request, inst: InstanceView, view: ClusterView) -> None:
        if self.index == "approx":
            super().remember(req, inst, view)
