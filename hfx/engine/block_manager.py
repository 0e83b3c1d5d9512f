# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Paged KV-cache accounting: fixed-size blocks, a free list, a block table per sequence, and
the prefix cache (prefix_cache.py).

``allocate`` grows a sequence's KV to cover a number of tokens, or allocates nothing when the
blocks are not free. With prefix caching (on by default, as in vLLM v1), a sequence's full
units of known content are offered to the cache as they are planned (its prompt's) or when it
lets its KV go (its output's: finished, preempted, aborted), and a waiting sequence's first
allocation may start from the cached units of its prefix (``cached_prefix``). A cached unit no
sequence references counts as free, so ``num_free_blocks`` means what the planners have
always read. Blocks a sequence references are never evicted.

The free blocks are one queue, as vLLM's ``FreeKVCacheBlockQueue``: never-used blocks first,
then blocks in the order they were freed, cached or not; allocation takes from its head and
evicts the cached units it takes. So a cached unit lives until as many blocks as were free
ahead of it have been taken, whether those held cached content or not. While no cached unit
is free the order is not kept (``_loose``: a count and a list of ids), which is every run of
a workload that names no content.

A sequence's block count (``Sequence.num_blocks``) is what the planners read. Its block ids
(``Sequence.block_table``) matter only to an executor that reads its sequences' KV (a real
model); with ``block_ids`` False (an executor that plans by the step's shape alone, the
simulator's) none are kept and the table stays empty: the same decisions, without touching a
list per sequence at each block a decode crosses (~9% of a 128-instance run, docs/performance.md).
"""

from __future__ import annotations

from collections import OrderedDict

from hfx.engine.prefix_cache import CachedUnit, CacheListener, unit_keys
from hfx.engine.sequence import Sequence


class _Run:
    """Free blocks without cached content, in the free queue behind a cached unit."""

    __slots__ = ("blocks", "ids")

    def __init__(self, blocks: int, ids: list[int] | None) -> None:
        self.blocks = blocks
        self.ids = ids


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, block_ids: bool = True,
                 prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, "
                             f"{block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_ids = block_ids
        self.num_free_blocks = num_blocks
        # The free ids are [num_blocks - 1, ..., _fresh] (never used; not materialised: a
        # simulated fleet of 1,000 engines spent 15% of its run building those lists) followed
        # by ``_returned`` (freed blocks, reused first). Taken from the end: lowest ids first,
        # which keeps runs easy to read in tests.
        self._fresh = 0
        self._returned: list[int] = []
        self.prefix_caching = prefix_caching
        self._cached: dict[int, CachedUnit] = {}  # every cached unit, by key
        # The free queue's head: free blocks taken before any in ``_order`` (never used, or
        # freed while no cached unit was free); their ids are ``_fresh`` on and ``_returned``.
        self._loose = num_blocks
        # The rest of the free queue, least recently freed first: cached units no sequence
        # holds (by key) and runs of other free blocks (by a tuple); kept while a unit is in it.
        self._order: OrderedDict[object, CachedUnit | _Run] = OrderedDict()
        self._runs = 0  # tuple keys of runs given out
        self.evictable_blocks = 0  # the units' blocks in ``_order``
        # vLLM's prefix-cache counters: prompt tokens of first admissions, and those of them
        # found cached; units evicted.
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evicted_units = 0
        # (request id, cached tokens) of the first admissions with a hit since the engine last
        # took them (StepOutput.cached).
        self.hits: list[tuple[str, int]] = []
        # Told of each unit cached and evicted (the control plane's index of this engine).
        self.listener: CacheListener | None = None

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``seq`` lacks to hold ``num_tokens`` tokens."""
        return max(0, -(-num_tokens // self.block_size) - seq.num_blocks)

    def allocate(self, seq: Sequence, num_tokens: int, reserve: int = 0,
                 cached: int = 0) -> bool:
        """Grow ``seq``'s KV to hold ``num_tokens``: whether it holds them now. False, with
        nothing allocated, when fewer than ``reserve`` blocks would stay free.

        ``cached``: a waiting sequence's first allocation starts from that many tokens of its
        prefix found cached (``cached_prefix``, just before): it holds their units, and they
        count as computed."""
        if cached:
            return self._allocate_cached(seq, num_tokens, reserve, cached)
        need = -(-num_tokens // self.block_size) - seq.num_blocks
        if need > 0:
            if need + reserve > self.num_free_blocks:
                return False
            self._claim(need)
            seq.num_blocks += need
            if self.block_ids:
                seq.block_table.extend(self._take_ids(need))
        if seq.unit_keys is None:
            if not self.prefix_caching or \
                    (seq.block_hashes is None and seq.prompt_token_ids is None):
                return True
            self._keys(seq)
        if seq.units_seen * seq.unit_size < seq.prompt_len:
            self._offer(seq, min(num_tokens, seq.prompt_len))
        return True

    def offers_pending(self, seq: Sequence) -> bool:
        """Whether growing ``seq``'s KV past its prompt would also cache prompt units it has
        computed and not offered: a prompt whose last chunk crossed no block boundary, on a
        planner that calls ``allocate`` only across one (planners/chunked.py)."""
        keys = seq.unit_keys
        return keys is not None and \
            min(len(keys), seq.prompt_len // seq.unit_size) > seq.units_seen

    def fits(self, seq: Sequence, num_tokens: int, reserve: int = 0, cached: int = 0) -> bool:
        """Whether ``allocate(seq, num_tokens, reserve, cached)`` would succeed, allocating
        nothing: vLLM's check that a new request's whole prompt fits before its first chunk is
        admitted (``scheduler_reserve_full_isl``, on by default)."""
        held, revived = seq.num_blocks, 0
        if cached:
            assert seq.unit_keys is not None
            for key in seq.unit_keys[:cached // seq.unit_size]:
                unit = self._cached[key]
                held += unit.blocks
                if not unit.refs:
                    revived += unit.blocks
        need = max(0, -(-num_tokens // self.block_size) - held)
        return need + revived + reserve <= self.num_free_blocks

    def take(self, n: int) -> bool:
        """Take ``n`` blocks for holders that keep their own counts (a decode cohort's members,
        counted by phase and synced later: cohort.py): whether they were free. Nothing is
        taken when they are not. No ids: only where the executor reads none."""
        assert not self.block_ids, "blocks with ids go to a sequence (allocate)"
        if n > self.num_free_blocks:
            return False
        self._claim(n)
        return True

    def _claim(self, n: int) -> None:
        """``n`` blocks leave the free queue from its head: the cached units among them are
        evicted."""
        self.num_free_blocks -= n
        order = self._order
        while self._loose < n:
            _, entry = order.popitem(last=False)
            if isinstance(entry, CachedUnit):
                del self._cached[entry.key]
                self.evictable_blocks -= entry.blocks
                self.evicted_units += 1
                if self.listener is not None:
                    self.listener.removed(entry.key)
            self._loose += entry.blocks
            if entry.ids is not None:
                self._returned.extend(entry.ids)
        self._loose -= n
        if order and not self.evictable_blocks:
            self._unorder()

    def _unorder(self) -> None:
        """No cached unit is free: the order of the rest no longer matters."""
        for entry in self._order.values():
            self._loose += entry.blocks
            if entry.ids is not None:
                self._returned.extend(entry.ids)
        self._order.clear()

    def _free_blocks(self, n: int, ids: list[int] | None) -> None:
        """``n`` blocks without cached content join the free queue's tail (``ids``, theirs
        in the order they go, where the engine keeps ids)."""
        if not n:
            return
        self.num_free_blocks += n
        if not self._order:
            self._loose += n
            if ids is not None:
                self._returned.extend(ids)
            return
        self._runs += 1
        self._order[(0, self._runs)] = _Run(n, ids)

    # ---- the prefix cache ---------------------------------------------------------------------
    def cached_keys(self) -> list[int]:
        """The keys of every unit cached here."""
        return list(self._cached)

    def _keys(self, seq: Sequence) -> list[int]:
        keys = seq.unit_keys
        if keys is None:
            keys, seq.unit_size = unit_keys(seq, self.block_size)
            seq.unit_keys = keys
        return keys

    def cached_prefix(self, seq: Sequence) -> int:
        """Tokens of a waiting sequence's prefix cached here, in whole units, leaving at least
        one token to compute (vLLM: the last token's logits are needed); 0 for one that holds
        KV already or whose content is unknown."""
        if not self.prefix_caching or seq.num_blocks or \
                (seq.block_hashes is None and seq.prompt_token_ids is None):
            return 0
        keys, cached = self._keys(seq), self._cached
        limit = min(len(keys), (seq.num_tokens - 1) // seq.unit_size)
        u = 0
        while u < limit and keys[u] in cached:
            u += 1
        return u * seq.unit_size

    def _allocate_cached(self, seq: Sequence, num_tokens: int, reserve: int,
                         cached: int) -> bool:
        assert not seq.num_blocks and seq.unit_keys is not None
        units = [self._cached[k] for k in seq.unit_keys[:cached // seq.unit_size]]
        held = revived = 0
        for unit in units:
            held += unit.blocks
            if not unit.refs:
                revived += unit.blocks
        need = -(-num_tokens // self.block_size) - held
        if need + revived + reserve > self.num_free_blocks:
            return False
        order = self._order
        for unit in units:
            if not unit.refs:
                del order[unit.key]  # out of the free queue, wherever it was
            unit.refs += 1
        self.evictable_blocks -= revived
        self.num_free_blocks -= revived
        if order and not self.evictable_blocks:
            self._unorder()
        seq.units = units
        seq.units_seen = len(units)
        seq.num_blocks = held
        seq.num_computed_tokens = cached
        if self.block_ids:
            seq.block_table = [i for unit in units for i in unit.ids or ()]
        return self.allocate(seq, num_tokens)

    def note_admission(self, seq: Sequence) -> None:
        """Count a sequence's first admission in the hit rate (what vLLM's prefix-cache
        queries and hits count), and report its hit."""
        if seq.num_preemptions:
            return
        self.queried_tokens += seq.prompt_len
        if seq.num_computed_tokens:
            seq.num_cached_tokens = seq.num_computed_tokens
            self.hit_tokens += seq.num_computed_tokens
            self.hits.append((seq.request_id, seq.num_computed_tokens))

    def _offer(self, seq: Sequence, tokens: int) -> None:
        """Cache ``seq``'s full units within its first ``tokens`` tokens that it has not offered
        yet. A unit cached already (another sequence computed the same content meanwhile)
        stays the sequence's own, as vLLM keeps such a duplicate block uncached."""
        keys, size, cached = self._keys(seq), seq.unit_size, self._cached
        start, end = seq.units_seen, min(len(keys), tokens // size)
        if end <= start:
            return
        per_unit = size // self.block_size
        units = seq.units
        table = seq.block_table if self.block_ids else None
        listener = self.listener
        for u in range(start, end):
            key = keys[u]
            if key in cached:
                continue
            unit = cached[key] = CachedUnit(
                key, per_unit, None if table is None else table[u * per_unit:(u + 1) * per_unit])
            units.append(unit)
            if listener is not None:
                listener.stored(key)
        seq.units_seen = end

    def _take_ids(self, need: int) -> list[int]:
        returned = self._returned
        if need <= len(returned):
            new = returned[-need:]
            del returned[-need:]
            return new
        # All the returned blocks, after the lowest never-used ones.
        fresh = need - len(returned)
        new = list(range(self._fresh + fresh - 1, self._fresh - 1, -1))
        new += returned
        returned.clear()
        self._fresh += fresh
        return new

    def free(self, seq: Sequence, computed: bool = True) -> None:
        """``seq`` lets its KV go (finished, preempted, aborted, migrated): the full units it
        computed stay cached, free to evict. ``computed`` False: its last step failed, so what
        it offered the cache may never have been written; the units only it held are dropped."""
        if seq.unit_keys is not None:
            if computed:
                if seq.block_hashes is None and seq.output_token_ids:
                    seq.unit_keys = None  # its token ids grew: hash its output too
                    self._keys(seq)
                self._offer(seq, seq.num_computed_tokens)
            seq.units_seen = 0
            if seq.units:
                self._release_units(seq, computed)
                return
        self._free_blocks(seq.num_blocks, seq.block_table[::-1] if self.block_ids else None)
        seq.num_blocks = 0
        if self.block_ids:
            seq.block_table = []

    def _release_units(self, seq: Sequence, keep: bool) -> None:
        units = seq.units
        order, cached = self._order, self._cached
        # Tail first, as vLLM frees a request's blocks in reverse order: its blocks without
        # cached content (its last ones; with ``keep`` False, the units only it held too),
        # then its units from the last, so that its tail is evicted before its head.
        unit_blocks = lost = 0
        for unit in units:
            unit_blocks += unit.blocks
            if not keep and unit.refs == 1:
                lost += unit.blocks
        own = seq.num_blocks - unit_blocks + lost
        if self.block_ids:
            kept = {b for unit in units if keep or unit.refs > 1 for b in unit.ids or ()}
            self._free_blocks(own, [b for b in reversed(seq.block_table) if b not in kept])
            seq.block_table = []
        else:
            self._free_blocks(own, None)
        freed = 0
        for i in range(len(units) - 1, -1, -1):
            unit = units[i]
            refs = unit.refs - 1
            unit.refs = refs
            if refs:
                continue
            if keep:
                order[unit.key] = unit
                freed += unit.blocks
            else:
                del cached[unit.key]  # its blocks were freed with the sequence's own
                if self.listener is not None:
                    self.listener.removed(unit.key)
        self.evictable_blocks += freed
        self.num_free_blocks += freed
        seq.num_blocks = 0
        seq.units = []
