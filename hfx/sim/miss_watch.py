"""Ending a simulated run once it can no longer reach a target attainment.

A capacity search (hfx/evaluation/capacity.py) only asks of a probe above the capacity whether
it meets the target; a run at twice a contender's capacity spent most of its CPU on a queue that
had decided the answer long before the run's end. ``MissWatch`` counts the requests certain to
miss under both of the result's attainments, Eq. 4's (``meets_slo``) and per-token deadlines'
(``meets_deadline_slo``):

- a request that ended and met neither (a rejected or shed one meets none);
- a request still open whose first token came, or is still to come, after its TTFT deadline:
  a late first token misses both.

Once these exceed ``(1 − target)`` of every request of the run (its arrivals before the
warm-up included, so the count bounds the scored window's from above), neither attainment can
reach ``target`` however the run goes on, and the watch sets ``stop``. The run's result then
says where it stopped (``stopped_at``), and its attainments are those of a truncated run: below
the target, but not the full run's. Open requests are looked at every ``interval`` simulated
seconds; the watch reads state only, so a run it does not stop is the same run to the last
digit.

It stops nothing after ``until``: a run not decided by then is near the target, and likely the
rate a search's crossing reads, which must then be run again whole. On eight searches of the
comparison a watch that gave up halfway through the scored window (``UNTIL_SHARE``) saved 23%
of their CPU, one that never gave up 18% (docs/log/2026-11-30-cheaper-searches.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hfx.cluster.control import ControlPlane
from hfx.request import Outcome, RequestRecord

CHECK_SECONDS = 10.0  # simulated seconds between looks at the open requests
UNTIL_SHARE = 0.5  # of the scored window: the watch gives up after it


class MissWatch:
    """Counts the certain misses of one run and sets ``stop`` once the target is out of reach."""

    def __init__(self, requests: int, target: float, warmup: float, until: float,
                 interval: float = CHECK_SECONDS) -> None:
        if not 0 < target <= 1:
            raise ValueError(f"target attainment must be in (0, 1], got {target}")
        self.allowed = (1 - target) * requests  # misses the target tolerates, at most
        self.warmup = warmup
        self.until = until  # no stop after this: the run goes on to its end
        self.interval = interval
        self.ended_misses = 0
        self.stopped_at: float | None = None
        self.stop = asyncio.Event()  # set by ``run``; ``drive`` ends the run on it
        self._control: ControlPlane | None = None
        self._then: Callable[[RequestRecord], None] | None = None

    def attach(self, control: ControlPlane) -> asyncio.Event:
        """Watch ``control``'s requests (after whatever else hears of their ends is set up);
        returns the event ``run`` sets, for ``drive``."""
        self._control = control
        self._then = control.ledger.on_done
        control.ledger.on_done = self._ended
        return self.stop

    def _ended(self, record: RequestRecord) -> None:
        if record.request.arrival >= self.warmup and not record.meets_slo() \
                and not record.meets_deadline_slo():
            self.ended_misses += 1
        if self._then is not None:
            self._then(record)

    def open_misses(self, now: float, enough: float = float("inf")) -> int:
        """Open requests of the scored window whose first token is, or will be, late; the
        count stops once it passes ``enough``."""
        assert self._control is not None, "attach first"
        late = 0
        for record in self._control.records.values():
            target = record.target
            if record.outcome is not Outcome.PENDING or target is None:
                continue
            arrival = record.request.arrival
            if arrival < self.warmup:
                continue
            first = record.first_token_time
            if (now if first is None else first) > arrival + target.ttft:
                late += 1
                if late > enough:
                    break
        return late

    async def run(self) -> None:
        """Look every ``interval`` seconds until the target is out of reach."""
        loop = asyncio.get_running_loop()
        # Nothing counts before the warm-up ends.
        await asyncio.sleep(max(0.0, self.warmup - loop.time()))
        while loop.time() + self.interval <= self.until:
            await asyncio.sleep(self.interval)
            assert self._control is not None, "attach first"
            left = self.allowed - self.ended_misses
            # Were every open request a miss, would that be too many? Else nothing to look at.
            if left < 0 or (len(self._control.records) > left
                            and self.open_misses(loop.time(), left) > left):
                self.stopped_at = loop.time()
                self.stop.set()
                return
