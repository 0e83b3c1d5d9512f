# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Requests HFX's dispatcher has left for the instance that holds most of their prompt cached,
hidden from other instances' scans of Q_R while that verdict stands (``HFXDispatcher.elsewhere``).

On prefix-heavy traffic most of the queue waits for a hit elsewhere (99.6% of the scans'
``elsewhere`` checks defer on the 32-instance session trace), so every mature instance walked
them all, and the simulation cost 2.9x its run without the cache (docs/performance.md). A
request is parked on instance j when its verdict there holds (p ≥ θ once j matures): the scan of
any instance that holds less of it than j would defer it again, so Q_R hides it from those
scans (``SLOQueue.hide``); the instances that hold as much (an application's system prompt
cached on several) ask for it (``asked_by`` names them). Exactly while every input of that verdict
stands:

- j's shadow (its version), its maturity, and the start (j not yet mature: the start is its
  maturity), the engine terms (``mixed``) and the step-time model: all of j's parked requests
  are released when any moves;
- the request's view of the caches: read again ``MATCH_TTL`` after it was read (``reread``),
  and released if the index says otherwise (PrefixIndex.match: the same dict while no key it
  walked moved), or when there is no ``reread``.

While every queued request is parked, only the instances that ask for one could take anything:
the dispatcher serves those (``first_asker``) and sleeps until an instance holding parked
requests matures or views are due to be read again (``next_change``); an arrival, a finish or
a snapshot calls it anyway.

One difference from scanning them: hidden requests do not count towards ``max_scan``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from hfx.policies.maturity import MaturityQueue
from hfx.policies.shadow import ShadowInstance, Shadows
from hfx.policies.slo_queue import SLOQueue
from hfx.stepmodel.latency import StepTimeModel


class Parking:
    def __init__(self, ttl: float, queue: SLOQueue,
                 reread: Callable[[str, float], bool] | None = None) -> None:
        self.ttl = ttl  # how long a request's view of the caches holds (MATCH_TTL)
        self._queue = queue  # Q_R, which hides what is parked
        # Reads a request's view again at a time: whether it is what it was.
        self._reread = reread
        self._on: dict[int, set[str]] = {}  # instance → request ids parked on it
        # instance → parked request ids it holds as much of as their instance (sees them)
        self._holds: dict[int, set[str]] = {}
        # instance → (its shadow, shadow version, maturity) when its requests were parked
        self._key: dict[int, tuple[ShadowInstance, int, float]] = {}
        # request id → (its instance, view read at, the instances holding as much)
        self._where: dict[str, tuple[int, float, tuple[int, ...]]] = {}
        self._all: set[str] = set()
        self._expiry: list[tuple[float, str]] = []  # (view read at, request id)
        self._mixed = False
        self._model: StepTimeModel | None = None
        # Within one dispatcher call (a round) only the instance just served can have moved
        # (its shadow, its maturity; ``now`` is the call's): the first ``refresh`` of a round
        # checks every parked instance, the later ones the one served since.
        self._checked = False
        self._last_asked = -1

    def __len__(self) -> int:
        return len(self._all)

    def park(self, rid: str, iid: int, top: tuple[int, ...], read_at: float,
             sh: ShadowInstance, mature: float, mixed: bool, model: StepTimeModel) -> None:
        """Park ``rid`` on ``iid``; ``top``: every instance holding as much of it (iid too)."""
        if model is not self._model or mixed != self._mixed:
            self.clear()
            self._model, self._mixed = model, mixed
        key = self._key.get(iid)
        if key is None or key[0] is not sh or key[1] != sh.version or key[2] != mature:
            self._release(iid)
            self._key[iid] = (sh, sh.version, mature)
        self.unpark(rid)
        self._on.setdefault(iid, set()).add(rid)
        for t in top:
            self._holds.setdefault(t, set()).add(rid)
        self._where[rid] = (iid, read_at, top)
        self._all.add(rid)
        heapq.heappush(self._expiry, (read_at, rid))
        self._queue.hide(rid)

    def unpark(self, rid: str) -> None:
        where = self._where.pop(rid, None)
        if where is not None:
            self._drop(rid, where)

    def _drop(self, rid: str, where: tuple[int, float, tuple[int, ...]]) -> None:
        self._on[where[0]].discard(rid)
        for t in where[2]:
            self._holds[t].discard(rid)
        self._all.discard(rid)
        self._queue.show(rid)

    def clear(self) -> None:
        for rid in self._all:
            self._queue.show(rid)
        self._on.clear()
        self._holds.clear()
        self._key.clear()
        self._where.clear()
        self._all.clear()
        self._expiry.clear()

    def _release(self, iid: int) -> None:
        for rid in list(self._on.get(iid, ())):
            self._drop(rid, self._where.pop(rid))
        self._on.pop(iid, None)
        self._key.pop(iid, None)

    def new_round(self) -> None:
        """A dispatcher call begins: anything may have moved since the last."""
        self._checked = False
        self._last_asked = -1

    def refresh(self, now: float, shadows: Shadows, maturity: MaturityQueue, mixed: bool,
                model: StepTimeModel) -> None:
        """Release what no longer stands: everything the first time in a round, then what the
        instance served since the last call (``asked_by``) moved."""
        last, self._last_asked = self._last_asked, -1
        if not self._all:
            return
        if model is not self._model or mixed != self._mixed:
            self.clear()
            return
        if self._checked:
            if last in self._key and self._stale(last, now, shadows, maturity):
                self._release(last)
            return
        self._checked = True
        expiry, where = self._expiry, self._where
        while expiry and now - expiry[0][0] >= self.ttl:
            read_at, rid = heapq.heappop(expiry)
            got = where.get(rid)
            if got is None or got[1] != read_at:
                continue  # unparked, or parked again since
            if self.ttl > 0 and self._reread is not None and self._reread(rid, now):
                where[rid] = (got[0], now, got[2])  # the view stands: read at now
                heapq.heappush(expiry, (now, rid))
            else:
                self.unpark(rid)
        for j in [j for j in self._key if self._stale(j, now, shadows, maturity)]:
            self._release(j)

    def asked_by(self, iid: int) -> set[str] | None:
        """The parked requests instance ``iid``, about to be served (after ``refresh``), asks
        Q_R for: those it holds as much of as their instance (None: none)."""
        self._last_asked = iid
        return (self._holds.get(iid) or None) if self._all else None

    def first_asker(self, maturity: MaturityQueue, now: float) -> int | None:
        """The earliest mature instance not yet served this round that asks for a parked
        request (in Q_W's (maturity, id) order); None when there is none."""
        best: tuple[float, int] | None = None
        for iid, rids in self._holds.items():
            if rids and maturity.ready(iid, now):
                key = (maturity[iid], iid)
                if best is None or key < best:
                    best = key
        return None if best is None else best[1]

    def next_change(self) -> float | None:
        """When a parking may next end by time alone (None: nothing is parked): an instance
        holding parked requests matures, or views are read again. Views come due on a grid
        of half the TTL, so that they are read together: a wake-up per view every ``ttl``
        doubled the dispatcher's calls on the 32-instance session trace (1.42x the CPU of
        the run without the cache, against 1.28x); a grid of the whole TTL, or reading them
        only at other calls, moved its 8-instance capacity from 17.25 to 16.5 req/s at the
        bisection's 5% (two seeds; the 90% crossings, interpolated, 17.3 → 17.1)."""
        if not (self._all and self._key):
            return None
        soonest = min(mature for _, _, mature in self._key.values())
        if self._expiry and self.ttl > 0:
            due = self._expiry[0][0] + self.ttl
            grid = self.ttl / 2
            soonest = min(soonest, math.ceil(due / grid) * grid)
        return soonest

    def _stale(self, j: int, now: float, shadows: Shadows, maturity: MaturityQueue) -> bool:
        sh, version, mature = self._key[j]
        return (now > mature or sh.version != version or shadows.get(j) is not sh
                or maturity.member_time(j) != mature)
