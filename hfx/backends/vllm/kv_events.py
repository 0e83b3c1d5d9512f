"""vLLM's KV cache events into HFX's prefix index (issue 47): which blocks a server holds, from
the server itself.

A vLLM server started with ``--kv-events-config`` publishes, over a ZeroMQ PUB socket, a
multipart message per batch of events: (topic, 8-byte big-endian sequence number, msgpack
``KVEventBatch``) — ``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``. A batch is
``[ts, events, data_parallel_rank]``; an event is ``BlockStored`` (block hashes, the parent's
hash, the blocks' token ids, block size, medium), ``BlockRemoved`` (hashes, medium) or
``AllBlocksCleared``, each a map with a ``type`` field (vLLM 0.32; older releases sent
``[type, field, ...]`` arrays, read here too).

vLLM names a block by sha256 over its parent's hash, its tokens and extra keys; HFX's index
names it by its own chain (hfx/engine/prefix_cache.py: the blake2b of its tokens under its
parent's key). A stored event carries the tokens, so each vLLM hash is translated to HFX's key
once, with the parent's translation, and kept until the block is removed — as llm-d's
kv-cache manager (``pkg/kvcache/kvevents``) rebuilds its own keys from the events' tokens
rather than trusting a hash it cannot reproduce. So HFX needs neither vLLM's hash function nor
its seed, and a request's match is the same walk over its own token ids as with any engine.

What is not applied is counted, never guessed into the index (``KVEventTranslator.counts``,
``hfx_kv_events`` on ``/metrics``): a malformed message or event, a sequence number that goes
back (out of order), a block whose parent was never seen (joined mid-stream, or events lost),
a removal of a block never seen, blocks of another medium (CPU offload), a partial block or
one with extra keys (LoRA, multimodal, a cache salt: HFX's keys carry none, so such a block
could never match). A sequence number back at 0 after others is a restarted server: all it
held is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Hashable
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from hfx.engine.prefix_cache import CacheListener, chain, chain_root, token_block_hashes

log = logging.getLogger(__name__)

# What became of each event (or message): the labels of ``hfx_kv_events``.
APPLIED, MALFORMED, OUT_OF_ORDER = "applied", "malformed", "out_of_order"
ORPHAN, UNKNOWN, SKIPPED, MISSED = "orphan", "unknown_block", "skipped", "missed"
OUTCOMES = (APPLIED, MALFORMED, OUT_OF_ORDER, ORPHAN, UNKNOWN, SKIPPED, MISSED)
_GPU = (None, "GPU")  # the medium a server's own KV cache is published as

# vLLM 0.32's field order, for the array form older releases send (tag first).
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys")
_REMOVED_FIELDS = ("block_hashes", "medium")


class MalformedEvent(ValueError):
    """A message or event that is not what vLLM's publisher sends."""


def decode_batch(payload: bytes) -> list[Any]:
    """The events of one published batch, undecoded (``apply`` reads each: one bad event
    costs itself, not its batch)."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise MalformedEvent(f"not msgpack: {e}") from None
    if not (isinstance(batch, list) and len(batch) >= 2 and isinstance(batch[1], list)):
        raise MalformedEvent("not a [ts, events, ...] batch")
    return batch[1]


def _event(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        if not isinstance(raw.get("type"), str):
            raise MalformedEvent("an event without a type")
        return raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        fields = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(raw[0], ())
        return {"type": raw[0], **dict(zip(fields, raw[1:], strict=False))}
    raise MalformedEvent(f"an event of type {type(raw).__name__}")


def _hashes(event: dict[str, Any]) -> list[Hashable]:
    hashes = event.get("block_hashes")
    if not (isinstance(hashes, list) and hashes
            and all(isinstance(h, bytes | int) for h in hashes)):
        raise MalformedEvent("block_hashes is not a list of hashes")
    return hashes


class KVEventTranslator:
    """One server's events, in sequence, onto its feed of the prefix index."""

    def __init__(self, feed: CacheListener, block_size: int) -> None:
        self.feed = feed
        self.block_size = block_size
        self._keys: dict[Hashable, int] = {}  # vLLM's hash of each held block → HFX's key
        self._root = chain_root(block_size)
        self.last_seq = -1
        self.counts: Counter[str] = Counter({o: 0 for o in OUTCOMES})

    @property
    def blocks(self) -> int:
        """Blocks the server holds, as its events say."""
        return len(self._keys)

    def on_message(self, frames: list[bytes]) -> None:
        """One ZeroMQ message: (topic, sequence number, payload)."""
        if len(frames) != 3 or len(frames[1]) != 8:
            self.counts[MALFORMED] += 1
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq == 0 and self.last_seq > 0:  # the server restarted: its cache is gone
            self.clear()
        elif seq <= self.last_seq:
            self.counts[OUT_OF_ORDER] += 1
            return
        elif self.last_seq >= 0 and seq > self.last_seq + 1:
            self.counts[MISSED] += seq - self.last_seq - 1  # what it held may be stale now
        self.last_seq = seq
        try:
            events = decode_batch(frames[2])
        except MalformedEvent as e:
            log.debug("kv events: batch %d dropped: %s", seq, e)
            self.counts[MALFORMED] += 1
            return
        for event in events:
            try:
                self.counts[self.apply(event)] += 1
            except MalformedEvent as e:
                log.debug("kv events: an event of batch %d dropped: %s", seq, e)
                self.counts[MALFORMED] += 1

    def apply(self, raw: Any) -> str:
        """Apply one event; returns what became of it (one of ``OUTCOMES``)."""
        event = _event(raw)
        kind = event["type"]
        if kind == "BlockStored":
            return self._stored(event)
        if kind == "BlockRemoved":
            hashes = _hashes(event)
            if event.get("medium") not in _GPU:
                return SKIPPED
            outcome = APPLIED
            for h in hashes:
                key = self._keys.pop(h, None)
                if key is None:
                    outcome = UNKNOWN
                else:
                    self.feed.removed(key)
            return outcome
        if kind == "AllBlocksCleared":
            self.clear()
            return APPLIED
        raise MalformedEvent(f"unknown event type {kind!r}")

    def _stored(self, event: dict[str, Any]) -> str:
        hashes = _hashes(event)
        tokens, size = event.get("token_ids"), event.get("block_size")
        if not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)
                and isinstance(size, int) and size > 0 and len(tokens) == size * len(hashes)):
            raise MalformedEvent("token_ids do not fill block_size × blocks")
        if (event.get("medium") not in _GPU or size != self.block_size
                or any(event.get("extra_keys") or ()) or event.get("lora_name")):
            return SKIPPED
        parent = event.get("parent_block_hash")
        if parent is None:
            root = self._root
        else:
            got = self._keys.get(parent)
            if got is None:
                return ORPHAN
            root = got
        keys = chain(token_block_hashes(tokens, size), 1, root)
        for h, key in zip(hashes, keys, strict=True):
            self._keys[h] = key
            self.feed.stored(key)
        return APPLIED

    def clear(self) -> None:
        for key in self._keys.values():
            self.feed.removed(key)
        self._keys.clear()


class KVEventSubscriber:
    """Subscribes to one server's publisher and feeds a translator until cancelled; keeps when
    the last message came (``last_at``, the loop's clock) so a silent stream can be told."""

    def __init__(self, endpoint: str, translator: KVEventTranslator, topic: str = "") -> None:
        self.endpoint = endpoint
        self.translator = translator
        self.topic = topic
        self.last_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name=f"kv-events {self.endpoint}")

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sock.connect(self.endpoint)
        loop = asyncio.get_running_loop()
        try:
            while True:
                frames = await sock.recv_multipart()
                self.last_at = loop.time()
                self.translator.on_message(frames)
        finally:
            sock.close(linger=0)
