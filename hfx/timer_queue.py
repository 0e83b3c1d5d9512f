"""The virtual loop's clock, timers and iteration: the part of ``VirtualTimeLoop`` that runs
per event, compiled with the engine (hfx/native.py).

Every event of a simulated run — an arrival, the end of an engine step, a token's delivery —
is a timer set, popped and run. As asyncio's Python code (``call_at``, ``TimerHandle.__init__``,
``_run_once``, ``Handle._run``) that is four Python frames an event, ~1.2 µs, and at two
instances a fifth of the run (issue 31). Here it is one compiled call to set a timer and one
compiled loop that runs them. The loop class stays asyncio's (clock.py): tasks, futures,
``call_soon`` and the exception handler are its own, and a handle is asyncio's ``TimerHandle``,
so ``cancel()`` and ``when()`` behave as everywhere else.
"""

from __future__ import annotations

import contextvars
from asyncio import events, format_helpers
from collections import deque
from heapq import heapify, heappop, heappush
from typing import Any

from mypy_extensions import mypyc_attr

# asyncio's own threshold for a purge (base_events._MIN_SCHEDULED_TIMER_HANDLES).
PURGE_AT = 100


@mypyc_attr(native_class=False)  # compiled, a class can derive from no builtin exception
class SimulationDeadlock(RuntimeError):
    """Every task waits and no timer is pending: nothing can ever happen again."""


class TimerQueue:
    """The clock (``now``) and the timers of one virtual loop.

    Timers are ``(when, order, handle)`` tuples in a heap, compared in C; ties fire in the
    order they were set (asyncio's heap leaves that to the heap's shape), so a run does not
    depend on how many other timers happened to be pending."""

    def __init__(self, loop: Any, start: float) -> None:
        self.loop = loop
        self.now = start
        self.heap: list[tuple[float, int, Any]] = []
        self._order = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        """asyncio's ``call_at``: a ``TimerHandle`` for ``callback(*args)`` at ``when``."""
        loop = self.loop
        if when is None:
            raise TypeError("when cannot be None")
        if loop._closed:
            raise RuntimeError("Event loop is closed")
        timer: Any  # asyncio's private fields, which typeshed does not declare
        if loop._debug:  # asyncio's own constructor: it records where the timer was set
            timer = events.TimerHandle(when, callback, args, loop, context)
        else:  # the fields ``TimerHandle.__init__`` sets, set here without its Python frames
            timer = events.TimerHandle.__new__(events.TimerHandle)
            timer._context = contextvars.copy_context() if context is None else context
            timer._loop = loop
            timer._callback = callback
            timer._args = args
            timer._cancelled = False
            timer._repr = None
            timer._source_traceback = None
            timer._when = when
        order = self._order
        self._order = order + 1
        heappush(self.heap, (when, order, timer))
        timer._scheduled = True
        return timer

    def run(self) -> None:
        """Iterations of the loop until ``stop()``: asyncio's ``run_forever`` calls
        ``_run_once`` until ``_stopping``, and each call here is all of those iterations.

        One iteration: if nothing is ready, jump the clock to the first live timer; move the
        timers due now to the ready queue; run what is ready (not what those callbacks make
        ready, which waits for the next iteration, as in asyncio)."""
        loop = self.loop
        ready: deque[Any] = loop._ready
        heap = self.heap
        while True:
            cancelled: int = loop._timer_cancelled_count
            if cancelled > PURGE_AT and cancelled * 2 > len(heap):
                self.purge()
            if not ready and not loop._stopping:
                while heap and heap[0][2]._cancelled:
                    heappop(heap)[2]._scheduled = False
                    loop._timer_cancelled_count -= 1
                if not heap:
                    raise SimulationDeadlock("every task is waiting and no timer is set")
                # To the timer's own time; one set in the past fires now (asyncio's timeout is
                # max(0, when - now)): the clock never goes back.
                first = heap[0][0]
                if first > self.now:
                    self.now = first
            # Exactly the timers due now (asyncio's own iteration fires those due before now +
            # the clock's resolution: on a clock that jumps, one due 1 ns later would fire early
            # and read a time before its own, and a step would end before start + duration).
            now = self.now
            while heap and heap[0][0] <= now:
                handle = heappop(heap)[2]
                handle._scheduled = False
                if handle._cancelled:
                    loop._timer_cancelled_count -= 1
                else:
                    ready.append(handle)
            for _ in range(len(ready)):
                handle = ready.popleft()
                if not handle._cancelled:
                    _run(handle)
            if loop._stopping:
                return

    def purge(self) -> None:
        """Drop cancelled timers from the heap at once when they are most of it (as asyncio
        does), so a run that cancels many (decode runs cut short) keeps the heap small."""
        live = []
        for entry in self.heap:
            if entry[2]._cancelled:
                entry[2]._scheduled = False
            else:
                live.append(entry)
        heapify(live)
        self.heap[:] = live  # in place: the loop's ``_scheduled`` is this list
        self.loop._timer_cancelled_count = 0


def _run(handle: Any) -> None:
    """``Handle._run``: the callback in its context; an exception goes to the loop's handler
    with asyncio's message, and the loop goes on."""
    try:
        handle._context.run(handle._callback, *handle._args)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        source = format_helpers._format_callback_source(handle._callback, handle._args)
        context = {"message": f"Exception in callback {source}", "exception": exc,
                   "handle": handle}
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        handle._loop.call_exception_handler(context)
