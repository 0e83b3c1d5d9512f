"""``dynamo``: NVIDIA Dynamo's KV router, its cost function and defaults (ai-dynamo/dynamo
``lib/llm/src/kv_router/scheduler.rs`` ``DefaultWorkerSelector::select_worker``;
``KvRouterConfig::default``): for each worker,

    logit = overlap_score_weight · prefill_blocks + decode_blocks     (lower is better)

prefill_blocks: the prompt's tokens past the worker's cached prefix, plus the uncached prompt
tokens it has in flight that are not prefilled yet, in blocks; decode_blocks: the unique KV
blocks of the requests it has in flight (a prefix they share counts once:
``router_assume_kv_reuse``), plus the request's blocks it does not hold yet. Defaults:
overlap_score_weight 1.0, router_temperature 0 (the lowest logit; ties to the worker whose
index holds the fewest blocks, then at random). The cached prefix comes from the instances'
own caches (Dynamo's default: vLLM's KV events; here the control plane's index).

Dynamo's router hears each request's first token (it proxies the stream) and then takes its
prompt out of the worker's pending prefill. A policy here hears finishes only, so the pending
prefill is the engine's waiting queue at the latest snapshot (its blocks) plus the uncached
prompt tokens routed there since.
"""

from __future__ import annotations

from hfx.engine.prefix_cache import prompt_keys
from hfx.policies.base import ClusterView, InstanceView
from hfx.policies.cache_router import CacheAwareRouter
from hfx.request import Request, RequestRecord

OVERLAP_SCORE_WEIGHT = 1.0  # KvRouterConfig::default
ROUTER_TEMPERATURE = 0.0  # the lowest logit (the only mode written here)


class DynamoKV(CacheAwareRouter):
    name = "dynamo"

    def __init__(self, overlap_score_weight: float = OVERLAP_SCORE_WEIGHT,
                 seed: int = 0) -> None:
        super().__init__(seed)
        self.weight = float(overlap_score_weight)
        # Per worker: the units of its in-flight requests, each with how many hold it.
        self._blocks: dict[int, dict[int, int]] = {}
        self._tails: dict[int, int] = {}  # per worker: their blocks past their full units
        self._inflight: dict[str, tuple[int, list[int], int]] = {}  # id → worker, units, tail
        # Per worker: (the view's version at the snapshot, uncached tokens routed since).
        self._pending: dict[int, tuple[int, int]] = {}

    def pick(self, req: Request, view: ClusterView, targets: list[InstanceView],
             placed: dict[int, int]) -> InstanceView:
        size = view.profile.block_size
        cached = view.cached(req)
        keys, unit = self._keys(req, view)
        per_unit = unit // size
        tail = -(-(req.prompt_len - len(keys) * unit) // size)
        cost: dict[int, float] = {}
        for inst in targets:
            mine = self._blocks.get(inst.id)
            new = sum(1 for k in keys if mine is None or k not in mine) * per_unit + tail
            active = (len(mine) * per_unit if mine else 0) + self._tails.get(inst.id, 0)
            prefill = (req.prompt_len - cached.get(inst.id, 0) + self._pending_tokens(inst, view)
                       ) / size
            cost[inst.id] = self.weight * prefill + active + new
        low = min(cost.values())
        tied = [i for i in targets if cost[i.id] == low]
        if len(tied) > 1:  # the worker whose index holds the fewest blocks, then at random
            fewest = min(len(self._blocks.get(i.id, ())) for i in tied)
            tied = [i for i in tied if len(self._blocks.get(i.id, ())) == fewest]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def _keys(self, req: Request, view: ClusterView) -> tuple[list[int], int]:
        return prompt_keys(req.block_hashes, req.hash_block, req.prompt_token_ids,
                           req.prompt_len, view.profile.block_size)

    def _pending_tokens(self, inst: InstanceView, view: ClusterView) -> int:
        version, routed = self._pending.get(inst.id, (view.version, 0))
        if version != view.version:  # a new snapshot: the engine's waiting queue says it
            routed = 0
            self._pending[inst.id] = (view.version, 0)
        return inst.stats.kv_waiting_blocks * inst.stats.block_size + routed

    def remember(self, req: Request, inst: InstanceView, view: ClusterView) -> None:
        keys, unit = self._keys(req, view)
        tail = -(-(req.prompt_len - len(keys) * unit) // view.profile.block_size)
        blocks = self._blocks.setdefault(inst.id, {})
        for k in keys:
            blocks[k] = blocks.get(k, 0) + 1
        self._tails[inst.id] = self._tails.get(inst.id, 0) + tail
        self._inflight[req.id] = (inst.id, keys, tail)
        version, routed = self._pending.get(inst.id, (view.version, 0))
        self._pending[inst.id] = (version, routed + req.prompt_len
                                  - view.cached(req).get(inst.id, 0))

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        got = self._inflight.pop(record.request.id, None)
        if got is None:
            return
        iid, keys, tail = got
        blocks = self._blocks[iid]
        for k in keys:
            n = blocks[k] - 1
            if n:
                blocks[k] = n
            else:
                del blocks[k]
        self._tails[iid] -= tail
