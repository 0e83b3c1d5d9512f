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

    def number(self, seq: Sequence) -> None:
        """Give ``seq`` its place in the engine's arrival order (``Sequence.arrival``): as it
        first queues, or as its KV is reserved here (an import, which never queues)."""
        self._arrivals += 1
        seq.arrival = self._arrivals

    def append(self, seq: Sequence) -> None:
        """A newcomer, at the back."""
        self.number(seq)
        self._queue.append(seq)
        self.blocks += self._blocks(seq)

    def appendleft(self, seq: Sequence) -> None:
        """At the front: a preempted sequence goes before every newcomer."""
        self._queue.appendleft(seq)
        self.blocks += self._blocks(seq)

    def remove(self, seq: Sequence) -> None:
        self._queue.remove(seq)
        self.blocks -= self._blocks(seq)

    def settle(self, now: float) -> None:
        """Reorder what time has changed: nothing, first come first served."""

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


# A heap entry: (key, arrival, sequence), the key a priority or a deadline; arrivals are
# unique, so sequences never compare.
_Entry = tuple[float, int, Sequence]


def _heap_remove(heap: list[_Entry], seq: Sequence) -> bool:
    """Take ``seq`` off the heap; whether it was there."""
    if heap and heap[0][2] is seq:  # admitted: the head, nearly always
        heapq.heappop(heap)
        return True
    for i, entry in enumerate(heap):
        if entry[2] is seq:
            heap[i] = heap[-1]
            heap.pop()
            heapq.heapify(heap)
            return True
    return False


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
        self.number(seq)
        self.appendleft(seq)

    def appendleft(self, seq: Sequence) -> None:
        heapq.heappush(self._heap, (self._priority_of(seq), seq.arrival, seq))
        self.blocks += self._blocks(seq)

    def remove(self, seq: Sequence) -> None:
        if not _heap_remove(self._heap, seq):
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


class DeadlineWaitingQueue(WaitingQueue):
    """Waiting sequences by TTFT deadline (arrival + TTFT), earliest first, while it is still
    ahead; those whose deadline has passed (``settle``), those sent best effort and those with
    no TTFT, after them, first come first served; a preempted one before all of them.
    PolyServe's bins are earliest-deadline-first (PolyServe §4.2); a sequence that can no
    longer make its first token goes last, so that under overload the late do not push every
    other request late in turn (EDF's domino).

    A dispatcher that holds its queue (HFX's) sends the engine about what its next steps take,
    so the order barely matters there; one that places every request at once (round robin,
    least-loaded) meets this queue with a burst, where first come first served put the long
    prompts of the loosest task ahead of every tight task's short ones."""

    __slots__ = ("_front", "_heap", "_late")

    def __init__(self, blocks_for: Callable[[int], int]) -> None:
        super().__init__(blocks_for)
        self._front: deque[Sequence] = deque()  # preempted: before every newcomer, as FCFS
        self._heap: list[_Entry] = []
        self._late: deque[Sequence] = deque()

    def append(self, seq: Sequence) -> None:
        self.number(seq)
        due = seq.prefill_deadline
        if seq.best_effort or due is None:
            self._late.append(seq)
        else:
            heapq.heappush(self._heap, (due, seq.arrival, seq))
        self.blocks += self._blocks(seq)

    def appendleft(self, seq: Sequence) -> None:
        """A preempted sequence goes before every waiting one: it has started (its TTFT
        deadline is behind it), and its decodes wait on it."""
        self._front.appendleft(seq)
        self.blocks += self._blocks(seq)

    def settle(self, now: float) -> None:
        """Move the sequences whose TTFT deadline is past behind those still in time."""
        heap, late = self._heap, self._late
        while heap and heap[0][0] < now:
            late.append(heapq.heappop(heap)[2])

    def remove(self, seq: Sequence) -> None:
        front, late = self._front, self._late
        if front and front[0] is seq:
            front.popleft()
        elif late and late[0] is seq:
            late.popleft()
        elif not _heap_remove(self._heap, seq):
            if seq in front:
                front.remove(seq)
            else:
                late.remove(seq)  # ValueError if it is not waiting
        self.blocks -= self._blocks(seq)

    def clear(self) -> None:
        self._front.clear()
        self._heap.clear()
        self._late.clear()
        self.blocks = 0

    def __getitem__(self, i: int) -> Sequence:
        if i == 0:
            if self._front:
                return self._front[0]
            return self._heap[0][2] if self._heap else self._late[0]
        return list(self)[i]

    def __iter__(self) -> Iterator[Sequence]:
        """In the order the queue serves them (a sorted copy: for the rare full read)."""
        return iter(list(self._front) + [entry[2] for entry in sorted(self._heap)]
                    + list(self._late))

    def __len__(self) -> int:
        return len(self._front) + len(self._heap) + len(self._late)

    def __bool__(self) -> bool:
        return bool(self._front) or bool(self._heap) or bool(self._late)

    def __contains__(self, seq: object) -> bool:
        return (seq in self._front or any(entry[2] is seq for entry in self._heap)
                or seq in self._late)
