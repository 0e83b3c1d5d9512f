# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Prefix caching's names for KV: blocks named by a chained hash of their content.

As vLLM v1 keeps them (``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``,
``block_pool.py``): a full block's hash is the hash of its parent block's hash and its own
tokens, so equal hashes mean equal prefixes; a sequence's full blocks are shared by reference
count; a block no sequence references stays cached, counted free, until it is evicted, least
recently freed first, a freed sequence's tail before its head.

A request may name its content by hashes of ``hash_block`` tokens (``Request.block_hashes``:
Mooncake's 512-token ``hash_ids``, our session workloads' 16) instead of token ids. The engine
caches *units* of ``lcm(hash_block, block_size)`` tokens, each named by the chain of its
content hashes: with 16-token KV blocks a 512-token hash names a unit of 32 blocks; with token
ids the unit is one block, as in vLLM. A unit is cached or evicted whole, and only when full:
a prompt's tail past its last full unit is never cached, since nothing says it repeats.

This module names units; ``BlockManager`` (block_manager.py) owns them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # sequence.py imports this module for CachedUnit
    from hfx.engine.sequence import Sequence

# The root of every chain, as vLLM's NONE_HASH: a unit's key depends on the granularity it
# was hashed at, so 512-token and 16-token names never meet.
_ROOT = 0x48465850  # "HFXP"


class CacheListener(Protocol):
    """Who hears which units an engine's cache gains and loses, as vLLM's KV events publish
    BlockStored and BlockRemoved (the control plane's index, hfx/policies/prefix_index.py)."""

    def stored(self, key: int) -> None: ...

    def removed(self, key: int) -> None: ...


class CachedUnit:
    """A full unit of KV blocks whose content is known: cached while any sequence references
    it, and after, until evicted."""

    __slots__ = ("blocks", "ids", "key", "refs")

    def __init__(self, key: int, blocks: int, ids: list[int] | None) -> None:
        self.key = key
        self.blocks = blocks  # KV blocks it holds
        self.ids = ids  # their ids, where the engine keeps ids (a real executor reads them)
        self.refs = 1  # sequences holding it: the one that computed it, at first


def token_block_hashes(tokens: Seq[int], block_size: int,
                       partial: bool = False) -> tuple[int, ...]:
    """A content hash per full ``block_size`` tokens, and with ``partial`` one for the tokens
    after the last full block (a request's hashes cover its whole prompt: Request): stable
    across processes and versions (a record stores them; blake2b, as vLLM offers sha256 for
    the same reason)."""
    out = []
    end = len(tokens) if partial else len(tokens) - block_size + 1
    for start in range(0, end, block_size):
        block = tokens[start:start + block_size]
        digest = hashlib.blake2b(b"".join(t.to_bytes(4, "little", signed=True) for t in block),
                                 digest_size=8).digest()
        out.append(int.from_bytes(digest, "little") >> 1)  # non-negative, as trace ids are
    return tuple(out)


def unit_tokens(hash_block: int, block_size: int) -> int:
    """Tokens per cached unit: the smallest span both granularities divide."""
    return hash_block * block_size // math.gcd(hash_block, block_size)


def chain(content: Seq[int], per_unit: int, root: int) -> list[int]:
    """The key of each full unit of ``per_unit`` content hashes: its parent's key and its own
    hashes, hashed (a tuple of ints hashes the same in every process)."""
    keys = []
    parent = root
    for u in range(len(content) // per_unit):
        parent = hash((parent, *content[u * per_unit:(u + 1) * per_unit]))
        keys.append(parent)
    return keys


def request_block_hashes(prompt_token_ids: Seq[int] | None,
                         block_hashes: tuple[int, ...] | None, hash_block: int,
                         block_size: int) -> tuple[tuple[int, ...], int] | None:
    """What a record keeps of a prompt's content (``hfx serve --record``): its own hashes, or
    its token ids' at the engine's block size; never the tokens."""
    if block_hashes is not None:
        return block_hashes, hash_block
    if prompt_token_ids is None:
        return None
    return token_block_hashes(prompt_token_ids, block_size, partial=True), block_size


def content_of(seq: Sequence, block_size: int) -> tuple[tuple[int, ...], int] | None:
    """A sequence's content hashes and their granularity: the request's own, or the hashes of
    its token ids at the engine's block size; None if it has neither."""
    if seq.block_hashes is not None:
        return seq.block_hashes, seq.hash_block
    if seq.prompt_token_ids is not None:
        return token_block_hashes([*seq.prompt_token_ids, *seq.output_token_ids],
                                  block_size), block_size
    return None


def unit_keys(seq: Sequence, block_size: int) -> tuple[list[int], int]:
    """The keys of a sequence's full units of known content, and the unit's tokens."""
    content = content_of(seq, block_size)
    if content is None:
        return [], block_size
    return keys_of(*content, block_size)


def prompt_keys(block_hashes: tuple[int, ...] | None, hash_block: int,
                prompt_token_ids: Seq[int] | None, prompt_len: int,
                block_size: int) -> tuple[list[int], int]:
    """A request's prompt's unit keys, as its engine will key them (the control plane's
    index, hfx/policies/prefix_index.py), and the unit's tokens."""
    if block_hashes is not None:
        keys, unit = keys_of(block_hashes, hash_block, block_size)
    elif prompt_token_ids is not None:
        keys, unit = keys_of(token_block_hashes(prompt_token_ids, block_size), block_size,
                             block_size)
    else:
        return [], block_size
    return keys[:prompt_len // unit], unit


def chain_root(hash_block: int) -> int:
    """The parent of a chain's first unit, for content hashed at ``hash_block`` tokens."""
    return _ROOT + hash_block


def keys_of(hashes: Seq[int], hash_block: int, block_size: int) -> tuple[list[int], int]:
    unit = unit_tokens(hash_block, block_size)
    return chain(hashes, unit // hash_block, chain_root(hash_block)), unit
