# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Q_R: requests ordered by (TPOT, arrival) — stricter TPOT first (HyperFlexis Algorithm 1).

One FIFO per TPOT target, scanned from the strictest target up. With fair shares between
tenants each FIFO is in start-tag order instead (hfx/cluster/fair_share.py tags every arrival;
with one tenant that is arrival order). Taking a request from the middle only marks its entry
dead, so a scan never rebuilds a deep queue and the caller may take what a scan yields; dead
entries are dropped when they reach the head, or all at once by the next scan when they
outnumber the live ones (a head that stays would otherwise keep them all).

A request may be hidden (``hide``): it stays queued but out of every scan but those that ask
for it (``scan``'s ``also``), until ``show`` puts it back in its place. HFX hides the requests
it left for the instance that holds their prompt cached (hfx/policies/parking.py): on the
32-instance session trace nearly the whole queue, which each scan otherwise stepped over.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Collection, Iterator

from hfx.request import Request
from hfx.tally import Tally


class _Entry:
    """A request's place in its FIFO. Taking or hiding the request kills the entry (the FIFO is
    not mutated under a scan); showing it again makes a new one at the same ``key``."""

    __slots__ = ("hidden", "key", "live", "placed", "request", "tpot")

    def __init__(self, request: Request, tpot: float, key: tuple[float, int, int]) -> None:
        self.request = request
        self.tpot = tpot
        # (start tag, 0 without fair shares; prompt length, 0 unless shortest first; push
        # order): its FIFO's order
        self.key = key
        self.live = True  # a scan of its FIFO yields it
        self.placed = False  # in its FIFO (a shown request waits for the next scan)
        self.hidden = False


def _key(entry: _Entry) -> tuple[float, int, int]:
    return entry.key


class SLOQueue:
    def __init__(self, shortest_first: bool = False) -> None:
        self.shortest_first = shortest_first
        self._classes: dict[float, deque[_Entry]] = {}  # TPOT target → FIFO by key
        self._tpots: list[float] = []  # sorted keys of _classes
        self._entries: dict[str, _Entry] = {}  # queued requests by id
        self._dead: dict[float, int] = {}  # TPOT target → dead entries still in its FIFO
        self._hidden: dict[float, int] = {}  # TPOT target → hidden requests of it
        self._hidden_total = 0
        self._showing: list[_Entry] = []  # shown since the last scan: placed when it starts
        self._ttfts = Tally()
        self._pushed = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request: Request) -> bool:
        return request.id in self._entries

    def requests(self) -> list[Request]:
        """Every queued request, in the order they were pushed."""
        return [e.request for e in self._entries.values()]

    def shown(self, request: Request, also: Collection[str] | None = None) -> bool:
        """Whether a scan asked for ``also`` would yield ``request``: queued and not hidden
        (or hidden and in ``also``)."""
        entry = self._entries.get(request.id)
        return entry is not None and (not entry.hidden
                                      or (also is not None and request.id in also))

    def push(self, request: Request, length: int | None = None) -> None:
        """Queue ``request``; with shortest first, by ``length`` (the prompt tokens it will
        compute: its prompt less what is cached) or else its prompt's."""
        assert request.slo is not None
        old = self._entries.get(request.id)
        if old is not None:
            self.take(old.request)  # queued twice under one id: the later push stands
        self._pushed += 1
        tag = request.fair_tag
        entry = _Entry(request, request.slo.tpot, (
            tag if tag is not None else 0.0,
            (request.prompt_len if length is None else length) if self.shortest_first else 0,
            self._pushed))
        self._entries[request.id] = entry
        self._ttfts.add(request.slo.ttft)
        self._place(entry)

    def _place(self, entry: _Entry) -> None:
        tpot = entry.tpot
        fifo = self._classes.get(tpot)
        if fifo is None:
            fifo = self._classes[tpot] = deque()
            self._dead[tpot] = 0
            bisect.insort(self._tpots, tpot)
        if not fifo or fifo[-1].key <= entry.key:
            fifo.append(entry)
        else:  # before the first with a later key (fair shares; a request shown again)
            fifo.insert(bisect.bisect_right(fifo, entry.key, key=_key), entry)
        entry.placed = True

    def _kill(self, entry: _Entry) -> None:
        if entry.live:
            entry.live = False
            if entry.placed:
                self._dead[entry.tpot] += 1

    def take(self, request: Request) -> None:
        """Remove a queued request (one ``scan`` yielded, or any by ``remove``)."""
        entry = self._entries.pop(request.id)
        self._kill(entry)
        if entry.hidden:
            self._hidden[entry.tpot] -= 1
            self._hidden_total -= 1
        assert request.slo is not None
        self._ttfts.discard(request.slo.ttft)

    def remove(self, request_id: str) -> bool:
        """Remove a queued request by id; False if it is not queued."""
        entry = self._entries.get(request_id)
        if entry is None:
            return False
        self.take(entry.request)
        return True

    def hide(self, request_id: str) -> None:
        """Keep a queued request out of scans but those that ask for it, until ``show``."""
        entry = self._entries.get(request_id)
        if entry is None or entry.hidden:
            return
        self._kill(entry)
        entry.hidden = True
        self._hidden[entry.tpot] = self._hidden.get(entry.tpot, 0) + 1
        self._hidden_total += 1

    def show(self, request_id: str) -> None:
        """Scan a hidden request again, in its place (from the next scan on)."""
        entry = self._entries.get(request_id)
        if entry is None or not entry.hidden:
            return
        self._hidden[entry.tpot] -= 1
        self._hidden_total -= 1
        shown = self._entries[request_id] = _Entry(entry.request, entry.tpot, entry.key)
        self._showing.append(shown)

    def min_ttft(self) -> float | None:
        return self._ttfts.tightest()

    def min_tpot(self) -> float | None:
        return self._tpots[0] if self._tpots else None

    def min_tpot_from(self, floor: float) -> float | None:
        """The tightest queued TPOT at or above ``floor``."""
        i = bisect.bisect_left(self._tpots, floor)
        return self._tpots[i] if i < len(self._tpots) else None

    def scan(self, limit: int, also: Collection[str] | None = None) -> Iterator[Request]:
        """Requests in (TPOT, arrival) order (start-tag order with fair shares), at most
        ``limit`` of them, with the hidden ones whose ids are in ``also`` in their places. The
        caller may ``take`` and ``hide`` what it is given while scanning."""
        self._place_shown()
        extra: dict[float, list[_Entry]] | None = None
        if also:
            extra = {}
            for rid in also:
                entry = self._entries.get(rid)
                if entry is not None and entry.hidden:
                    extra.setdefault(entry.tpot, []).append(entry)
            for entries in extra.values():
                entries.sort(key=_key)
        seen = 0
        for tpot in list(self._tpots):
            fifo = self._tidy(tpot)
            if fifo is None:
                continue
            ext = extra.get(tpot) if extra is not None else None
            for entry in (fifo if ext is None else self._merged(fifo, ext)):
                if not entry.live:
                    continue
                yield entry.request
                seen += 1
                if seen >= limit:
                    return

    def _place_shown(self) -> None:
        for shown in self._showing:
            if shown.live and self._entries.get(shown.request.id) is shown:
                self._place(shown)
        self._showing.clear()

    def _tidy(self, tpot: float) -> deque[_Entry] | None:
        """TPOT class ``tpot``'s FIFO rid of its dead head (of all its dead, once they outnumber
        the live), or None once no queued request holds that target (the class is gone)."""
        fifo = self._classes[tpot]
        dead = self._dead[tpot]
        if dead and 2 * dead > len(fifo):
            fifo = self._compact(tpot, fifo)
        else:
            while fifo and not fifo[0].live:
                fifo.popleft()
                dead -= 1
            self._dead[tpot] = dead
        if fifo or self._hidden.get(tpot):
            return fifo
        del self._classes[tpot]
        del self._dead[tpot]
        self._hidden.pop(tpot, None)
        self._tpots.remove(tpot)
        return None

    def visible(self) -> int:
        """Queued requests a scan that asks for none of the hidden would see."""
        return len(self._entries) - self._hidden_total

    def _merged(self, fifo: deque[_Entry], ext: list[_Entry]) -> Iterator[_Entry]:
        """``fifo`` with the hidden ``ext`` (sorted by key) in their places, each as live while
        it is still hidden and queued."""
        i, n = 0, len(ext)
        for entry in fifo:
            while i < n and ext[i].key < entry.key:
                yield from self._asked(ext[i])
                i += 1
            yield entry
        while i < n:
            yield from self._asked(ext[i])
            i += 1

    def _asked(self, entry: _Entry) -> Iterator[_Entry]:
        if entry.hidden and self._entries.get(entry.request.id) is entry:
            yield _Entry(entry.request, entry.tpot, entry.key)  # live: a view, not placed

    def _compact(self, tpot: float, fifo: deque[_Entry]) -> deque[_Entry]:
        """``fifo`` without its dead entries, in the same order (never while it is walked)."""
        live = self._classes[tpot] = deque(entry for entry in fifo if entry.live)
        self._dead[tpot] = 0
        return live
