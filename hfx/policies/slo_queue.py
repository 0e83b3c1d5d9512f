# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Q_R: requests ordered by (TPOT, arrival) — stricter TPOT first (HyperFlexis Algorithm 1).

One FIFO per TPOT target, scanned from the strictest target up. With fair shares between
tenants each FIFO is in start-tag order instead (hfx/cluster/fair_share.py; with one tenant that
is arrival order). Taking a request from the middle only marks it; marked requests are dropped
when they reach the head, so a scan never rebuilds a deep queue.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from hfx.request import Request
from hfx.tally import Tally

_NOTHING: frozenset[str] = frozenset()


def _after(queued: Request, tag: float) -> bool:
    """Whether a request with start tag ``tag`` may queue behind ``queued``."""
    return queued.fair_tag is None or queued.fair_tag <= tag


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
        tag = request.fair_tag
        if tag is None or not fifo or _after(fifo[-1], tag):
            fifo.append(request)
        else:  # fair shares (hfx/cluster/fair_share.py): before the first with a later tag
            fifo.insert(next(i for i, r in enumerate(fifo) if not _after(r, tag)), request)
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

    def scan(self, limit: int, skip: set[str] | None = None,
             eligible: float | None = None) -> Iterator[Request]:
        """Requests in (TPOT, arrival) order (start-tag order with fair shares), at most
        ``limit`` of them, but those whose ids are in ``skip`` (not counted). The caller may
        ``take`` what it is given while scanning. With fair shares, ``eligible``
        (ClusterView.fair_eligible): the requests whose start tag is within it come first, in
        (TPOT, tag) order, then the rest (a tenant far past its share)."""
        if eligible is None:
            yield from self._scan(limit, skip, None, True)
            return
        seen = 0
        for within in (True, False):
            for req in self._scan(limit - seen, skip, eligible, within):
                yield req
                seen += 1
            if seen >= limit:
                return

    def _scan(self, limit: int, skip: set[str] | None, eligible: float | None,
              within: bool) -> Iterator[Request]:
        """``scan``'s pass over the requests within ``eligible`` (``within``) or past it."""
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
                if eligible is not None:
                    tag = req.fair_tag
                    if (tag is None or tag <= eligible) != within:
                        if within:
                            break  # in tag order: the rest of this FIFO is past it too
                        continue
                if req.id in taken or req.id in skipped:
                    continue
                yield req
                seen += 1
                if seen >= limit:
                    return
