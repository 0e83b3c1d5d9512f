"""The queue of sequences waiting for KV, with the blocks they will need kept as a total.

A deque with a running sum: in overload the queue grows without bound, and a sum over it on
every stats snapshot (the Monitor's, each second) made long simulated runs quadratic.
A waiting sequence's length does not change until it runs, so the sum stays exact.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from hfx.engine.sequence import Sequence


class WaitingQueue:
    __slots__ = ("_blocks_for", "_queue", "blocks")

    def __init__(self, blocks_for: Callable[[int], int]) -> None:
        self._queue: deque[Sequence] = deque()
        self._blocks_for = blocks_for  # the engine's BlockManager.blocks_for
        self.blocks = 0  # Σ blocks each queued sequence needs for its tokens so far

    def _blocks(self, seq: Sequence) -> int:
        return self._blocks_for(seq.num_tokens)

    def append(self, seq: Sequence) -> None:
        self._queue.append(seq)
        self.blocks += self._blocks(seq)

    def appendleft(self, seq: Sequence) -> None:
        """At the front: a preempted sequence goes before every newcomer."""
        self._queue.appendleft(seq)
        self.blocks += self._blocks(seq)

    def remove(self, seq: Sequence) -> None:
        self._queue.remove(seq)
        self.blocks -= self._blocks(seq)

    def clear(self) -> None:
        self._queue.clear()
        self.blocks = 0

    def __getitem__(self, i: int) -> Sequence:
        return self._queue[i]

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __contains__(self, seq: object) -> bool:
        return seq in self._queue
