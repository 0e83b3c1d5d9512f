"""The waiting queue of HFX's scheduler inside vLLM (scheduler.py): requests by TTFT deadline
(arrival + the TTFT each carries in ``vllm_xargs``), earliest first, while it is still ahead;
those past it and those with no TTFT after them, first come first served. The same order as
HFX's deadline-chunked planner in the simulator (hfx/engine/waiting.py, DeadlineWaitingQueue;
PolyServe §4.2's bins are earliest-deadline-first), so that a dispatcher which places every
request at once does not meet a first-come queue with steps paced to the loosest tight TPOT.

It has the methods vLLM's scheduler calls on ``self.waiting`` (vLLM 0.32's
``v1/core/sched/request_queue.py``: ``RequestQueue``) and imports neither vLLM nor the rest of
HFX: it runs in vLLM's interpreter, and the tests drive it with stand-in requests. vLLM puts a
preempted request back with ``prepend_request``: it goes before every waiting one (it has
started, its TTFT is behind it), as vLLM's first-come queue does. The requests a step skipped
come back with ``prepend_requests``: each to its place.
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
        self._front: deque[Any] = deque()  # preempted
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
        if self._front:
            return self._front.popleft()
        if self._heap:
            return heapq.heappop(self._heap)[3]
        if self._late:
            return self._late.popleft()
        raise IndexError("pop from an empty queue")

    def peek_request(self) -> Any:
        if self._front:
            return self._front[0]
        if self._heap:
            return self._heap[0][3]
        if self._late:
            return self._late[0]
        raise IndexError("peek at an empty queue")

    def prepend_request(self, request: Any) -> None:
        """A preempted request: before every waiting one."""
        self._front.appendleft(request)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        """Requests a step skipped: each back to its place (one without a deadline to the
        late's front, the first given first)."""
        for request in reversed(list(requests)):
            if self._deadline_of(request) is None:
                self._late.appendleft(request)
            else:
                self.add_request(request)

    def remove_request(self, request: Any) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Any]) -> None:
        gone = {id(r) for r in requests}
        heap = [e for e in self._heap if id(e[3]) not in gone]
        if len(heap) != len(self._heap):
            heapq.heapify(heap)
            self._heap = heap
        self._front = deque(r for r in self._front if id(r) not in gone)
        self._late = deque(r for r in self._late if id(r) not in gone)

    def __bool__(self) -> bool:
        return bool(self._front) or bool(self._heap) or bool(self._late)

    def __len__(self) -> int:
        return len(self._front) + len(self._heap) + len(self._late)

    def __iter__(self) -> Iterator[Any]:
        """In the order the queue serves them."""
        return iter(list(self._front) + [e[3] for e in sorted(self._heap, key=lambda e: e[:3])]
                    + list(self._late))
