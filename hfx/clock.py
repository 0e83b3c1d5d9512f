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
import heapq
import itertools
import selectors
from asyncio import events
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SimulationDeadlock(RuntimeError):
    """Every task waits and no timer is pending: nothing can ever happen again."""


class _VirtualSelector(selectors.SelectSelector):
    """A selector that never reports I/O. ``VirtualTimeLoop`` never polls it (its iteration is
    its own); asyncio's constructor needs one for the loop's self-pipe."""

    def select(self, timeout: float | None = None) -> list:
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop whose ``time()`` is virtual and starts at ``start``.

    Its timers and its iteration are its own. asyncio's heap orders ``TimerHandle`` objects by
    a Python ``__lt__`` (≈7 calls per timer at 128 instances) and each iteration polls a
    selector, works out a timeout and re-reads the clock; with nothing but timers to wait on,
    none of that is needed. Timers here are ``(when, order, handle)`` tuples, compared in C, and
    ties fire in the order they were set (asyncio's heap leaves that to the heap's shape), so a
    run does not depend on how many other timers happened to be pending. Callbacks run exactly
    as asyncio runs them (``Handle._run``: same context, same exception handler)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._order = itertools.count()
        super().__init__(selector=_VirtualSelector())

    def time(self) -> float:
        return self._now

    # The methods below use BaseEventLoop's private state (``_scheduled``, ``_ready``,
    # ``_stopping``, ``_timer_cancelled_count``), which typeshed does not declare: ``base``
    # is ``self`` typed as Any.
    def call_at(self, when: float, callback: Any, *args: Any,  # type: ignore[override]
                context: Any = None) -> asyncio.TimerHandle:
        base: Any = self
        if when is None:
            raise TypeError("when cannot be None")
        base._check_closed()
        timer: Any = events.TimerHandle(when, callback, args, self, context)
        heapq.heappush(base._scheduled, (when, next(self._order), timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """One iteration: if nothing is ready, jump the clock to the first live timer; move
        the timers due now to the ready queue; run what is ready (not what those callbacks
        make ready, which waits for the next iteration, as in asyncio)."""
        base: Any = self
        if base._timer_cancelled_count > _PURGE_AT and \
                base._timer_cancelled_count * 2 > len(base._scheduled):
            self._purge_cancelled()
        heap, ready = base._scheduled, base._ready
        pop = heapq.heappop
        if not ready and not base._stopping:
            while heap and heap[0][2]._cancelled:
                pop(heap)[2]._scheduled = False
                base._timer_cancelled_count -= 1
            if not heap:
                raise SimulationDeadlock("every task is waiting and no timer is set")
            # To the timer's own time; one set in the past fires now (asyncio's timeout is
            # max(0, when - now)): the clock never goes back.
            self._now = max(self._now, heap[0][0])
        # Exactly the timers due now (asyncio's own iteration fires those due before now + the
        # clock's resolution: on a clock that jumps, one due 1 ns later would fire early and
        # read a time before its own, and a step would end before start + duration).
        now = self._now
        while heap and heap[0][0] <= now:
            handle = pop(heap)[2]
            handle._scheduled = False
            if handle._cancelled:
                base._timer_cancelled_count -= 1
            else:
                ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def _purge_cancelled(self) -> None:
        """Drop cancelled timers from the heap at once when they are most of it (as asyncio
        does), so a run that cancels many (decode runs cut short) keeps the heap small."""
        base: Any = self
        live = []
        for entry in base._scheduled:
            if entry[2]._cancelled:
                entry[2]._scheduled = False
            else:
                live.append(entry)
        heapq.heapify(live)
        base._scheduled = live
        base._timer_cancelled_count = 0


# asyncio's own threshold for a purge (base_events._MIN_SCHEDULED_TIMER_HANDLES).
_PURGE_AT = 100


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
