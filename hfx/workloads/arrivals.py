# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Requests submitted at their arrival times on the virtual loop, compiled with the engine
(hfx/native.py): each arrival's timer submits its request and every later one already due,
then sets the timer of the first that is not — one timer per request, no task woken per
request. ``hfx.sim.driver.drive`` uses it on the virtual clock from time 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hfx.request import Request


class Arrivals:
    """``n`` requests, ``read(i)`` the ``i``-th in arrival order, each given to ``submit`` at
    its arrival on ``loop``; ``done`` (a future) is set when the last one is in."""

    def __init__(self, loop: Any, submit: Callable[[Request], object],
                 read: Callable[[int], Request], n: int, done: Any) -> None:
        self._loop = loop
        self._submit = submit
        self._read = read
        self._n = n
        self._done = done

    def start(self) -> None:
        if not self._n:
            self._done.set_result(None)
            return
        first = self._read(0)
        if first.arrival <= self._loop.time():
            self.arrive(0, first)
        else:
            self._loop.call_at(first.arrival, self.arrive, 0, first)

    def arrive(self, i: int, req: Request) -> None:
        """Submit request ``i`` (``req``, read once: a stream builds it on each read) and
        every later one already due; set the timer of the first one that is not."""
        now: float = self._loop.time()
        n = self._n
        while True:
            self._submit(req)
            i += 1
            if i == n:
                self._done.set_result(None)
                return
            req = self._read(i)
            if req.arrival > now:
                self._loop.call_at(req.arrival, self.arrive, i, req)
                return
