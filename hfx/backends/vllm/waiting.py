"""The waiting queue of HFX's scheduler inside vLLM (scheduler.py): requests by TTFT deadline
(arrival + the TTFT each carries in ``vllm_xargs``), earliest first, while it is still ahead;
those past it and those with no TTFT after them, first come first served. The same order as
HFX's deadline-chunked planner in the simulator (hfx/engine/waiting.py, DeadlineWaitingQueue;
PolyServe §4.2's bins are earliest-deadline-first), so that a dispatcher which places every
request at once does not meet a first-come queue with steps paced to the loosest tight TPOT.

It has the methods vLLM's scheduler calls on ``self.waiting`` (vLLM 0.32's
``v1/core/sched/request_queue.py``: ``RequestQueue``) and imports neither vLLM nor the rest of
HFX: it runs in vLLM's interpreter, and the tests drive it with stand-in requests. vLLM's
priority queue prepends by re-adding; so does this one, except that a request already past its
deadline goes to the front of the late.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# (TTFT deadline, arrival time, tie, request): the tie keeps requests from being compared.
_Entry = tuple[float, float, int, Any]


class DeadlineRequestQueue:
    def __init__(self, deadline_of: Callable[[Any], float | None]) -> None:
        self._deadline_of = deadline_of  # a request's TTFT deadline (s, wall clock), or None
        self._heap: list[_Entry] = []
        self._late: deque[Any] = deque()
        self._tie = itertools.count()

    def settle(self, now: float) -> None:
        """Move the requests whose TTFT deadline is past behind those still in time."""
        heap, late = self._heap, self._late
        while heap and heap[0][0] < now:
            late.append(heapq.heappop(heap)[3])

    def add_request(self, request: Any) -> None:
        deadline = self._deadline_of(request)
        if deadline is None:
            self._late.append(request)
        else:
            heapq.heappush(self._heap, (deadline, request.arrival_time, next(self._tie), request))

    def pop_request(self) -> Any:
        if self._heap:
            return heapq.heappop(self._heap)[3]
        if self._late:
            return self._late.popleft()
        raise IndexError("pop from an empty queue")

    def peek_request(self) -> Any:
        if self._heap:
            return self._heap[0][3]
        if self._late:
            return self._late[0]
        raise IndexError("peek at an empty queue")

    def prepend_request(self, request: Any) -> None:
        if self._deadline_of(request) is None:
            self._late.appendleft(request)
        else:
            self.add_request(request)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        for request in reversed(list(requests)):  # the first given ends up first
            self.prepend_request(request)

    def remove_request(self, request: Any) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Any]) -> None:
        gone = {id(r) for r in requests}
        heap = [e for e in self._heap if id(e[3]) not in gone]
        if len(heap) != len(self._heap):
            heapq.heapify(heap)
            self._heap = heap
        self._late = deque(r for r in self._late if id(r) not in gone)

    def __bool__(self) -> bool:
        return bool(self._heap) or bool(self._late)

    def __len__(self) -> int:
        return len(self._heap) + len(self._late)

    def __iter__(self) -> Iterator[Any]:
        """In the order the queue serves them."""
        return iter([e[3] for e in sorted(self._heap, key=lambda e: e[:3])] + list(self._late))
