# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The queue of sequences waiting for KV, with the blocks they will need kept as a total.

A deque with a running sum: in overload the queue grows without bound, and a sum over it on
every stats snapshot (the Monitor's, each second) made long simulated runs quadratic.
A waiting sequence's length does not change until it runs, so the sum stays exact.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator

from hfx.engine.sequence import Sequence


class WaitingQueue:
    __slots__ = ("_arrivals", "_blocks_for", "_queue", "blocks")

    def __init__(self, blocks_for: Callable[[int], int]) -> None:
        self._queue: deque[Sequence] = deque()
        self._blocks_for = blocks_for  # the engine's BlockManager.blocks_for
        self.blocks = 0  # Σ blocks each queued sequence needs for its tokens so far
        self._arrivals = 0  # sequences queued so far (Sequence.arrival)

    def _blocks(self, seq: Sequence) -> int:
        return self._blocks_for(seq.num_tokens)

    def append(self, seq: Sequence) -> None:
        """A newcomer, at the back."""
        self._arrivals += 1
        seq.arrival = self._arrivals
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


# A heap entry: (priority, arrival, sequence); arrivals are unique, so sequences never compare.
_Entry = tuple[int, int, Sequence]


class PriorityWaitingQueue(WaitingQueue):
    """vLLM v1's PriorityRequestQueue (``vllm/v1/core/sched/request_queue.py``): waiting
    sequences by (priority, arrival), lower first. A preempted sequence goes back by the same
    key, not to the front: vLLM's ``prepend_request`` on this queue is ``add_request``.

    ``priority_of`` maps a sequence to its vLLM priority (the one HFX sends:
    hfx.engine.planners.vllm.vllm_priority). The FIFO the base class keeps stays empty."""

    __slots__ = ("_heap", "_priority_of")

    def __init__(self, blocks_for: Callable[[int], int],
                 priority_of: Callable[[Sequence], int]) -> None:
        super().__init__(blocks_for)
        self._heap: list[_Entry] = []
        self._priority_of = priority_of

    def append(self, seq: Sequence) -> None:
        self._arrivals += 1
        seq.arrival = self._arrivals
        self.appendleft(seq)

    def appendleft(self, seq: Sequence) -> None:
        heapq.heappush(self._heap, (self._priority_of(seq), seq.arrival, seq))
        self.blocks += self._blocks(seq)

    def remove(self, seq: Sequence) -> None:
        heap = self._heap
        if heap[0][2] is seq:  # admitted: the head, nearly always
            heapq.heappop(heap)
        else:
            for i, entry in enumerate(heap):
                if entry[2] is seq:
                    heap[i] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    break
            else:
                raise ValueError(f"{seq.request_id} is not waiting")
        self.blocks -= self._blocks(seq)

    def clear(self) -> None:
        self._heap.clear()
        self.blocks = 0

    def __getitem__(self, i: int) -> Sequence:
        if i == 0:
            return self._heap[0][2]
        return sorted(self._heap)[i][2]

    def __iter__(self) -> Iterator[Sequence]:
        """In the order the queue serves them (a sorted copy: for the rare full read)."""
        return iter([entry[2] for entry in sorted(self._heap)])

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __contains__(self, seq: object) -> bool:
        return any(entry[2] is seq for entry in self._heap)
