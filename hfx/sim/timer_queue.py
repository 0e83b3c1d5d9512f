# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The virtual loop's clock, timers and iteration: the part of ``VirtualTimeLoop`` that runs
per event, compiled with the engine (hfx/native.py).

Every event of a simulated run — an arrival, the end of an engine step, a token's delivery —
is a timer set, popped and run. As asyncio's Python code (``call_at``, ``TimerHandle.__init__``,
``_run_once``, ``Handle._run``) that is four Python frames an event, ~1.2 µs, and at two
instances a fifth of the run (issue 31). Here a timer is a compiled ``Timer`` and one compiled
loop runs them. The loop class stays asyncio's (clock.py): tasks, futures, ``call_soon`` and
the exception handler are its own. A ``Timer`` answers as asyncio's ``TimerHandle`` does
(``cancel``, ``cancelled``, ``when``), as uvloop's own handle class does.
"""

from __future__ import annotations

import contextvars
import sys
from asyncio import format_helpers
from collections import deque
from heapq import heapify, heappop, heappush
from typing import Any

from mypy_extensions import mypyc_attr

# asyncio's own threshold for a purge (base_events._MIN_SCHEDULED_TIMER_HANDLES).
PURGE_AT = 100


@mypyc_attr(native_class=False)  # compiled, a class can derive from no builtin exception
class SimulationDeadlock(RuntimeError):
    """Every task waits and no timer is pending: nothing can ever happen again."""


class Timer:
    """``callback(*args)`` at ``when``, in ``context``: what ``call_at`` returns."""

    def __init__(self, queue: TimerQueue, when: float, callback: Any, args: tuple[Any, ...],
                 context: Any) -> None:
        self._queue = queue
        self._when = when
        self._callback = callback
        self._args: tuple[Any, ...] | None = args
        self._context = context
        self._cancelled = False
        self._scheduled = True  # in the heap, not yet due
        # Read by asyncio's ``call_later``; a debug loop's record of where the timer was set.
        self._source_traceback: Any = None

    def when(self) -> float:
        return self._when

    def cancelled(self) -> bool:
        return self._cancelled

    def get_context(self) -> Any:
        return self._context

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            if self._scheduled:
                self._queue.num_cancelled += 1
            self._callback = None  # as asyncio's: what it would have called is let go
            self._args = None

    def run(self) -> None:
        """``Handle._run``: the callback in its context; an exception goes to the loop's
        handler with asyncio's message, and the loop goes on."""
        try:
            self._context.run(self._callback, *(self._args or ()))
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            _report(self._queue.loop, self, exc)

    def __repr__(self) -> str:
        state = " cancelled" if self._cancelled else ""
        source = format_helpers._format_callback_source(self._callback, self._args or ())
        return f"<Timer{state} when={self._when} {source}>"


class TimerQueue:
    """The clock (``now``) and the timers of one virtual loop.

    Timers are ``(when, order, handle)`` tuples in a heap, compared in C; ties fire in the
    order they were set (asyncio's heap leaves that to the heap's shape), so a run does not
    depend on how many other timers happened to be pending."""

    def __init__(self, loop: Any, start: float) -> None:
        self.loop = loop
        self.now = start
        self.heap: list[tuple[float, int, Timer]] = []
        self.num_cancelled = 0  # cancelled timers still in the heap
        self._order = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Timer:
        """asyncio's ``call_at``: ``callback(*args)`` at ``when``."""
        loop = self.loop
        if when is None:
            raise TypeError("when cannot be None")
        if loop._closed:
            raise RuntimeError("Event loop is closed")
        timer = Timer(self, when, callback, args,
                      contextvars.copy_context() if context is None else context)
        if loop._debug:
            timer._source_traceback = format_helpers.extract_stack(sys._getframe(1))
        order = self._order
        self._order = order + 1
        heappush(self.heap, (when, order, timer))
        return timer

    def run(self) -> None:
        """Iterations of the loop until ``stop()``: asyncio's ``run_forever`` calls
        ``_run_once`` until ``_stopping``, and each call here is all of those iterations.

        One iteration, as asyncio's: if nothing is ready, jump the clock to the first live
        timer; run what is ready (``call_soon``), then the timers due now, in heap order (asyncio
        appends those to the ready queue: the same order). What these callbacks make ready
        waits for the next iteration."""
        loop = self.loop
        ready: deque[Any] = loop._ready
        heap = self.heap
        while True:
            if self.num_cancelled > PURGE_AT and self.num_cancelled * 2 > len(heap):
                self.purge()
            if not ready and not loop._stopping:
                while heap and heap[0][2]._cancelled:
                    heappop(heap)[2]._scheduled = False
                    self.num_cancelled -= 1
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
            due: list[Timer] = []
            while heap and heap[0][0] <= now:
                timer = heappop(heap)[2]
                timer._scheduled = False
                if timer._cancelled:
                    self.num_cancelled -= 1
                else:
                    due.append(timer)
            for _ in range(len(ready)):
                handle = ready.popleft()
                if not handle._cancelled:
                    _run_handle(handle)
            for timer in due:
                if not timer._cancelled:  # an earlier callback may have cancelled it
                    timer.run()
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
        self.num_cancelled = 0


def _run_handle(handle: Any) -> None:
    """``Handle._run`` of a ``call_soon`` handle, without its Python frame."""
    try:
        handle._context.run(handle._callback, *handle._args)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        _report(handle._loop, handle, exc)


def _report(loop: Any, handle: Any, exc: BaseException) -> None:
    """What ``Handle._run`` tells the loop's exception handler."""
    source = format_helpers._format_callback_source(handle._callback, handle._args)
    context = {"message": f"Exception in callback {source}", "exception": exc,
               "handle": handle}
    if handle._source_traceback:
        context["source_traceback"] = handle._source_traceback
    loop.call_exception_handler(context)
