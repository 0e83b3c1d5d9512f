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
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from hfx.sim.timer_queue import SimulationDeadlock as SimulationDeadlock
from hfx.sim.timer_queue import TimerQueue

T = TypeVar("T")


class _VirtualSelector(selectors.SelectSelector):
    """A selector that never reports I/O. ``VirtualTimeLoop`` never polls it (its iteration is
    its own); asyncio's constructor needs one for the loop's self-pipe."""

    def select(self, timeout: float | None = None) -> list:
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop whose ``time()`` is virtual and starts at ``start``.

    Its clock, timers and iteration are a ``TimerQueue`` (hfx/sim/timer_queue.py, compiled with
    the engine): with nothing but timers to wait on, asyncio's selector poll, timeout and
    clock re-reads are not needed, and its heap orders ``TimerHandle`` objects by a Python
    ``__lt__`` (≈7 calls per timer at 128 instances). ``call_at`` returns a ``Timer``, which
    answers as a ``TimerHandle`` (``cancel``, ``cancelled``, ``when``), as uvloop's handles
    do. Callbacks run exactly as asyncio runs them (same context, same exception handler)."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(selector=_VirtualSelector())
        timers = self._timers = TimerQueue(self, float(start))
        base: Any = self  # BaseEventLoop's private state, which typeshed does not declare
        base._scheduled = timers.heap
        # The queue's bound methods in place of the class's: a loop method called per event
        # (the engine reads the time many times a step) runs without a Python frame.
        self.time = timers.time  # type: ignore[method-assign]
        self.call_at = timers.call_at  # type: ignore[method-assign, assignment]

    def time(self) -> float:
        return self._timers.now

    def call_at(self, when: float, callback: Any, *args: Any,  # type: ignore[override]
                context: Any = None) -> asyncio.TimerHandle:
        # A ``Timer``, typed as the handle it stands in for (its methods are the same).
        return self._timers.call_at(  # type: ignore[return-value]
            when, callback, *args, context=context)

    def _run_once(self) -> None:
        """Every iteration until ``stop()`` (``TimerQueue.run``); ``run_forever`` then sees
        ``_stopping`` and returns."""
        self._timers.run()


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
