"""Two clocks for one code path: the ordinary asyncio loop, and a virtual-time loop.

On ``VirtualTimeLoop`` the loop's clock jumps to the next timer whenever every task waits, so
the same engine and control-plane code becomes a discrete-event simulator: deterministic for a
seed, thousands of simulated seconds per wall second. There is no real I/O on it: a task that
waits on something no timer will ever resolve is a deadlock, reported as such.

We measured the maintained alternative, ``looptime`` 0.9, on this machine: 3.8k timer wake-ups
per second against 78k for this loop (docs/performance.md), too slow for cluster-scale runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SimulationDeadlock(RuntimeError):
    """Every task waits and no timer is pending: nothing can ever happen again."""


class _VirtualSelector(selectors.SelectSelector):
    """A selector that never reports I/O; waiting on it advances the virtual clock."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        if timeout is None:
            raise SimulationDeadlock("every task is waiting and no timer is set")
        if timeout > 0:
            # To the next timer's time itself, not now + (when - now), which can differ in the
            # last bit: a step that ends at start + duration then reads exactly that, however
            # many other timers fired in between (what decode runs rely on: decode_run.py).
            scheduled = self._loop._scheduled  # type: ignore[attr-defined]
            self._loop._now = scheduled[0].when() if scheduled else self._loop._now + timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop whose ``time()`` is virtual and starts at ``start``."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    # asyncio fires the timers due before time() + the clock's resolution, so on a clock that
    # jumps, a timer 1 ns ahead of the one that set the time would fire early and its callback
    # read a time before its own: a step would end before start + duration. One ulp fires
    # exactly the timers due now.
    @property
    def _clock_resolution(self) -> float:
        return math.ulp(self._now)

    @_clock_resolution.setter
    def _clock_resolution(self, value: float) -> None:
        pass  # the real clock's, set by asyncio's constructor


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended: a background loop's stop."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def run(coro: Coroutine[Any, Any, T], *, virtual: bool) -> T:
    """Run ``coro`` to completion on a fresh virtual-time or ordinary loop."""
    loop: asyncio.AbstractEventLoop = VirtualTimeLoop() if virtual else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
