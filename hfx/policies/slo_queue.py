"""Q_R: requests ordered by (TPOT, arrival) — stricter TPOT first (HyperFlexis Algorithm 1).

One FIFO per TPOT target, scanned from the strictest target up. Taking a request from the middle
only marks it; marked requests are dropped when they reach the head, so a scan never rebuilds a
deep queue.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from hfx.request import Request
from hfx.tally import Tally

_NOTHING: frozenset[str] = frozenset()


class SLOQueue:
    def __init__(self) -> None:
        self._classes: dict[float, deque[Request]] = {}  # TPOT target → FIFO by arrival
        self._tpots: list[float] = []  # sorted keys of _classes
        self._taken: set[str] = set()
        self._queued: dict[str, Request] = {}  # by id: what ``remove`` looks up
        self._ttfts = Tally()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, request: Request) -> bool:
        return request.id in self._queued

    def push(self, request: Request) -> None:
        assert request.slo is not None
        tpot = request.slo.tpot
        fifo = self._classes.get(tpot)
        if fifo is None:
            fifo = self._classes[tpot] = deque()
            bisect.insort(self._tpots, tpot)
        fifo.append(request)
        self._queued[request.id] = request
        self._ttfts.add(request.slo.ttft)
        self._size += 1

    def take(self, request: Request) -> None:
        """Remove a request yielded by ``scan``."""
        self._taken.add(request.id)
        del self._queued[request.id]
        self._size -= 1
        assert request.slo is not None
        self._ttfts.discard(request.slo.ttft)

    def remove(self, request_id: str) -> bool:
        """Remove a queued request by id; False if it is not queued."""
        request = self._queued.get(request_id)
        if request is None:
            return False
        self.take(request)
        return True

    def min_ttft(self) -> float | None:
        return self._ttfts.tightest()

    def min_tpot(self) -> float | None:
        return self._tpots[0] if self._tpots else None

    def scan(self, limit: int, skip: set[str] | None = None) -> Iterator[Request]:
        """Requests in (TPOT, arrival) order, at most ``limit`` of them, but those whose ids
        are in ``skip`` (not counted). The caller may ``take`` what it is given while
        scanning."""
        seen = 0
        taken, skipped = self._taken, skip if skip is not None else _NOTHING
        for tpot in list(self._tpots):
            fifo = self._classes[tpot]
            while fifo and fifo[0].id in self._taken:
                self._taken.discard(fifo.popleft().id)
            if not fifo:
                del self._classes[tpot]
                self._tpots.remove(tpot)
                continue
            # Taking a request only marks it, so the FIFO is not mutated while we iterate.
            for req in fifo:
                if req.id in taken or req.id in skipped:
                    continue
                yield req
                seen += 1
                if seen >= limit:
                    return
