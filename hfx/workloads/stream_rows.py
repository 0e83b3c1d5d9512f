# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""A request stream's rows, and a ``Request`` built from one: the per-request part of
``RequestStream`` (hfx/workloads/load.py), compiled with the engine (hfx/native.py).

A run reads each request of its stream once, in order, at its arrival: as Python that read was
a fifth of an arrival's cost on two instances (issue 31). ``RequestStream`` stays the
``Sequence`` the rest of the code sees; a run's arrivals read ``StreamRows.request`` directly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hfx.request import SLO, Request

BLOCK = 4096  # rows turned into Python numbers at once

# Rows [lo, hi) as five columns: arrival time, task, index in the task, prompt and output length.
RowSource = Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                       np.ndarray]]


class StreamRows:
    """Five columns a request, in arrival order — task (its position in ``names``), index in
    its task, arrival time, prompt and output length — and, for each task, its name, its SLO
    and, in place of the SLO, its priority (HFX-PM)."""

    def __init__(self, names: list[str], slos: list[SLO], priorities: list[int] | None,
                 source: RowSource, size: int, block: int = BLOCK) -> None:
        self.names = names
        self.slos = slos
        self.priorities = priorities
        self.source = source  # read a block at a time, in order (hfx/workloads/task_draws.py)
        self.size = size
        self.block = block
        # The rows of the block read last, as Python numbers.
        self._block = -1
        self._orders: list[int] = []
        self._index: list[int] = []
        self._times: list[float] = []
        self._ins: list[int] = []
        self._outs: list[int] = []

    def with_priorities(self, priorities: list[int], source: RowSource) -> StreamRows:
        """The same rows, read from ``source``, each request carrying its task's priority
        instead of an SLO."""
        return StreamRows(self.names, self.slos, priorities, source, self.size, self.block)

    def request(self, i: int) -> Request:
        """Request ``i`` (0 <= i < size)."""
        size = self.block
        b = i // size
        if b != self._block:  # a run reads in order: a block of rows as Python numbers
            times, orders, index, ins, outs = self.source(b * size, (b + 1) * size)
            self._times = times.tolist()
            self._orders = orders.tolist()
            self._index = index.tolist()
            self._ins = ins.tolist()
            self._outs = outs.tolist()
            self._block = b
        k = i - b * size
        order = self._orders[k]
        name = self.names[order]
        slo: SLO | None = None
        priority: int | None = None
        if self.priorities is None:
            slo = self.slos[order]
        else:  # HFX-PM: the task's priority in place of its SLO
            priority = self.priorities[order]
        return Request(f"{name}-{self._index[k]}", self._times[k], self._ins[k], self._outs[k],
                       slo, name, priority)
