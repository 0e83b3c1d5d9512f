"""Paged KV-cache accounting: fixed-size blocks, a free list, and a block table per sequence.

No prefix caching: a block belongs to exactly one sequence. ``allocate`` grows a sequence's KV
to cover a number of tokens, or allocates nothing when the blocks are not free.

A sequence's block count (``Sequence.num_blocks``) is what the planners read. Its block ids
(``Sequence.block_table``) matter only to an executor that reads its sequences' KV (a real
model); with ``block_ids`` False (an executor that plans by the step's shape alone, the
simulator's) none are kept and the table stays empty: the same decisions, without touching a
list per sequence at each block a decode crosses (~9% of a 128-instance run, docs/performance.md).
"""

from __future__ import annotations

from hfx.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, block_ids: bool = True) -> None:
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

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``seq`` lacks to hold ``num_tokens`` tokens."""
        return max(0, -(-num_tokens // self.block_size) - seq.num_blocks)

    def allocate(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        """Grow ``seq``'s KV to hold ``num_tokens``: whether it holds them now. False, with
        nothing allocated, when fewer than ``reserve`` blocks would stay free."""
        need = -(-num_tokens // self.block_size) - seq.num_blocks
        if need <= 0:
            return True
        if need + reserve > self.num_free_blocks:
            return False
        self.num_free_blocks -= need
        seq.num_blocks += need
        if self.block_ids:
            seq.block_table.extend(self._take_ids(need))
        return True

    def take(self, n: int) -> bool:
        """Take ``n`` blocks for holders that keep their own counts (a decode cohort's members,
        counted by phase and synced later: cohort.py): whether they were free. Nothing is
        taken when they are not. No ids: only where the executor reads none."""
        assert not self.block_ids, "blocks with ids go to a sequence (allocate)"
        if n > self.num_free_blocks:
            return False
        self.num_free_blocks -= n
        return True

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

    def free(self, seq: Sequence) -> None:
        self.num_free_blocks += seq.num_blocks
        seq.num_blocks = 0
        if self.block_ids:
            self._returned.extend(reversed(seq.block_table))
            seq.block_table = []
