# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The control plane's index of every instance's prefix cache (issue 47): which instance holds
which cached unit, so that a policy sees how much of a request's prompt each instance has cached.

One index for the fleet, keyed as the engines key their units (hfx/engine/prefix_cache.py: a
chain of content hashes, so a key names its whole prefix), each key with the instances that hold
it: llm-d's kv-cache index (block hash → pods) and Dynamo's radix indexer keep the same map.
Each instance feeds it from one source, named in ``sources`` (and on ``/metrics``):

- ``engine``: the instance's own engine (the simulator, the own engine in this process) tells
  it of each unit cached and evicted (``BlockManager.listener``), as vLLM's KV events publish
  BlockStored and BlockRemoved. Exact.
- ``kv-events``: a vLLM server's own KV events (``--kv-events-config``, its ZeroMQ publisher;
  hfx/backends/vllm/kv_events.py translates its block hashes to these keys). Exact, a
  message's latency behind. A server whose stream stops falls back to ``estimate``.
- ``estimate``: what HFX routed there (any backend: vLLM servers, Ray actors): each dispatched
  prompt's units, least recently routed evicted once they exceed the instance's KV blocks, as
  llm-d's approximate prefix scorer and SGLang's router keep a tree of routed prompts. It misses
  what the engine evicted early (its running requests' KV comes first) and keeps nothing of
  outputs.

A match walks a request's unit keys from the first: an instance's cached prefix is the run of
leading keys it holds, whole units, at least one token left to compute (as the engine counts
its hit). Memory: one entry per unit an instance holds, so bounded by the fleet's KV capacity.
"""

from __future__ import annotations

from collections import OrderedDict

from hfx.engine.prefix_cache import prompt_keys
from hfx.request import Request

ENGINE, EVENTS, ESTIMATE = "engine", "kv-events", "estimate"


class _Feed:
    """One engine's events into the index (``CacheListener``)."""

    __slots__ = ("_changed", "_holders", "_id", "_index", "_mine")

    def __init__(self, index: PrefixIndex, instance_id: int) -> None:
        self._index = index
        self._holders = index._holders
        self._changed = index._changed
        self._id = instance_id
        self._mine = index._held.setdefault(instance_id, set())

    def stored(self, key: int) -> None:
        holders = self._holders.get(key)
        if holders is None:
            self._holders[key] = {self._id}
        elif self._id in holders:
            return
        else:
            holders.add(self._id)
        self._mine.add(key)
        self._index.epoch += 1
        self._changed[key] = self._index.epoch

    def removed(self, key: int) -> None:
        holders = self._holders.get(key)
        if holders is not None and self._id in holders:
            holders.discard(self._id)
            if holders:
                self._index.epoch += 1
                self._changed[key] = self._index.epoch
            else:
                del self._holders[key]
                del self._changed[key]
        self._mine.discard(key)


class PrefixIndex:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size  # the engines' KV block size: units are keyed with it
        self._holders: dict[int, set[int]] = {}  # unit key → instances holding it
        # Each held key's last change (a count of changes), so that a request's match is read
        # again only when a key it walked moved: a queued request is asked for every
        # ``MATCH_TTL`` (hfx.py), and on a prefix-heavy trace its keys rarely move meanwhile.
        self.epoch = 0
        self._changed: dict[int, int] = {}
        # request id → (epoch read at, keys walked, the last walked missing, the match)
        self._matched: dict[str, tuple[int, int, bool, dict[int, int]]] = {}
        self._held: dict[int, set[int]] = {}  # instance → the keys it holds
        # ``estimate`` instances: their routed units, least recently routed first, and how many
        # units their KV holds.
        self._routed: dict[int, OrderedDict[int, None]] = {}
        self._room: dict[int, int] = {}
        self.sources: dict[int, str] = {}
        self._keys: dict[str, tuple[list[int], int]] = {}  # request id → its prompt's unit keys
        # Per instance, the prompt tokens this index said it held as each request was
        # dispatched there: against the engine's own hit count, how true the index is.
        self.predicted_hits: dict[int, int] = {}

    # ---- sources ----------------------------------------------------------------------------
    def watch(self, instance_id: int, source: str = ENGINE) -> _Feed:
        """The listener an instance's engine tells its cache's changes (``engine``), or its
        events do (``kv-events``)."""
        self.sources[instance_id] = source
        return _Feed(self, instance_id)

    def estimate(self, instance_id: int, kv_blocks: int) -> None:
        """Index ``instance_id`` from what is routed there (source ``estimate``)."""
        self.sources[instance_id] = ESTIMATE
        self._routed[instance_id] = OrderedDict()
        self._room[instance_id] = kv_blocks
        self._held.setdefault(instance_id, set())

    def fall_back(self, instance_id: int, kv_blocks: int) -> None:
        """The instance's own feed stopped: forget what it said, estimate from now on."""
        self.drop(instance_id)
        self.estimate(instance_id, kv_blocks)

    def drop(self, instance_id: int) -> None:
        """The instance left (released, failed, restarted): nothing of it is cached any more."""
        feed = _Feed(self, instance_id)
        for key in list(self._held.get(instance_id, ())):
            feed.removed(key)
        self._held.pop(instance_id, None)
        self._routed.pop(instance_id, None)
        self._room.pop(instance_id, None)
        self.sources.pop(instance_id, None)

    def routed(self, instance_id: int, request: Request) -> None:
        """A request was dispatched here: count what the index says it finds cached, and an
        ``estimate`` instance now caches its prompt."""
        keys, unit = self.keys(request)
        if keys:
            self.predicted_hits[instance_id] = (self.predicted_hits.get(instance_id, 0)
                                                + self.match(request).get(instance_id, 0))
        routed = self._routed.get(instance_id)
        if routed is None:
            return  # an engine source says what it caches itself
        feed = _Feed(self, instance_id)
        for key in keys[:request.prompt_len // unit]:
            if key in routed:
                routed.move_to_end(key)
            else:
                routed[key] = None
                feed.stored(key)
        per_unit = max(1, unit // self.block_size)
        while len(routed) * per_unit > self._room[instance_id]:
            key, _ = routed.popitem(last=False)
            feed.removed(key)

    # ---- what a policy asks ------------------------------------------------------------------
    def keys(self, request: Request) -> tuple[list[int], int]:
        """A request's prompt's unit keys and the unit's tokens (kept until ``forget``)."""
        got = self._keys.get(request.id)
        if got is None:
            got = self._keys[request.id] = prompt_keys(
                request.block_hashes, request.hash_block, request.prompt_token_ids,
                request.prompt_len, self.block_size)
        return got

    def forget(self, request_id: str) -> None:
        self._keys.pop(request_id, None)
        self._matched.pop(request_id, None)

    def match(self, request: Request) -> dict[int, int]:
        """Tokens of the request's prompt each instance holds cached (instances with none are
        absent). The same dict as the last call's while no key it walked has moved; do not
        modify it."""
        keys, unit = self.keys(request)
        if not keys:
            return {}
        last = self._matched.get(request.id)
        if last is not None and self._still(keys, last):
            return last[3]
        limit = min(len(keys), (request.prompt_len - 1) // unit)
        out: dict[int, int] = {}
        alive: set[int] | None = None
        holders = self._holders
        walked, missing = limit, False
        for u in range(limit):
            held = holders.get(keys[u])
            if not held:
                walked, missing = u + 1, True
                break
            if alive is None:
                alive = set(held)
            elif not alive <= held:  # a holder's match ends here (a subset test allocates none)
                gone = alive - held
                if gone:
                    for iid in gone:
                        out[iid] = u * unit
                    alive -= gone
            if not alive:
                walked = u + 1
                break
        else:
            u = limit  # every key walked: the instances still alive hold them all
        for iid in alive or ():
            out[iid] = u * unit
        self._matched[request.id] = (self.epoch, walked, missing, out)
        return out

    def _still(self, keys: list[int], last: tuple[int, int, bool, dict[int, int]]) -> bool:
        """Whether a walk now would see what the last one saw: each key it found held
        unchanged since, and the one it found missing (if it stopped there) still missing."""
        at, walked, missing, _ = last
        changed = self._changed
        for u in range(walked - 1 if missing else walked):
            moved = changed.get(keys[u])
            if moved is None or moved > at:
                return False
        return not (missing and keys[walked - 1] in changed)

    def units_held(self, instance_id: int) -> int:
        return len(self._held.get(instance_id, ()))
