"""A task set's requests drawn a chunk at a time, the same numbers as drawn all at once.

``RequestStream`` (hfx/workloads/load.py) draws each task's arrival times, then its prompt
lengths, then its output lengths, from the task's own generator, and merges the tasks in arrival
order (ties: task order, then index). Held whole, that is five numbers a request from the start:
~600 MB for the 27 M requests of ten minutes on 1,000 instances (issue 31), growing with the run.

Here a task's three columns come from three copies of its generator, each set where the
all-at-once draw would start that column: the lengths' starting states are found by one pass
over the arrivals (and the prompt lengths) that keeps only their count. numpy's ``Generator``
draws a distribution element by element, so ``n`` values drawn in chunks are the ``n`` values
drawn at once; the cumulative sums carry their running total, summed in the same order. The
merge emits every row earlier than the last buffered arrival of every task not yet drawn to its
end: no later row of any task can precede those. Memory is a few chunks, whatever the length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hfx.workloads.tasks import MAX_LEN, TaskSpec

DRAW = 1 << 13  # rows a task draws at once: a batch of the merge stays a few MB

Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# A task's arrival times as chunks, drawn from the generator given (in order, each drawn only
# when asked for: the first pass reads them all to find where the lengths' draws start).
ArrivalChunks = Callable[[int, TaskSpec, np.random.Generator], Iterator[np.ndarray]]
Lengths = Callable[[np.random.Generator, float, float, int], np.ndarray]


def lognormal_lengths(rng: np.random.Generator, mean: float, std: float, n: int) -> np.ndarray:
    """``n`` integer lengths from the log-normal with this mean and std, clipped to [1, MAX_LEN]."""
    sigma2 = math.log1p((std / mean) ** 2)
    mu = math.log(mean) - sigma2 / 2
    x = rng.lognormal(mu, math.sqrt(sigma2), n)
    return np.clip(np.rint(x), 1, MAX_LEN).astype(np.int64)


def _generator(state: Any) -> np.random.Generator:  # a PCG64 state (a TypedDict of numpy's)
    bits = np.random.PCG64()
    bits.state = state
    return np.random.Generator(bits)


def cumsum_from(total: float | None, steps: np.ndarray) -> np.ndarray:
    """``np.cumsum`` of steps that continue a sum at ``total`` (None: a new sum), summed in the
    order one ``np.cumsum`` over the whole would have."""
    if total is None:
        return np.cumsum(steps)
    return np.cumsum(np.concatenate(([total], steps)))[1:]


class TaskDraws:
    """One task's rows: (arrival, task order, index, prompt length, output length) chunks.
    A task of at most ``draw`` rows keeps them from the first pass (a short run's tasks)."""

    def __init__(self, order: int, task: TaskSpec, rng: np.random.Generator,
                 arrivals: ArrivalChunks, lengths: Lengths, draw: int = DRAW) -> None:
        if not isinstance(rng.bit_generator, np.random.PCG64):
            raise TypeError("a task's generator must be numpy's default (PCG64)")
        self.order, self.task = order, task
        self._arrivals, self._lengths = arrivals, lengths
        self._start = rng.bit_generator.state
        self.count, self.last = 0, -np.inf  # rows, and the latest arrival
        kept: list[np.ndarray] = []
        for times in arrivals(order, task, rng):
            if not len(times):
                continue
            times = np.asarray(times, dtype=np.float64)
            if float(np.min(times)) < self.last:  # within a chunk, the order is free
                raise ValueError(f"task {task.name!r}: arrival chunks out of order")
            self.count += len(times)
            self.last = float(np.max(times))
            if self.count <= draw:
                kept.append(times)
        self._ins_start = rng.bit_generator.state
        for lo in range(0, self.count, draw):
            ins = lengths(rng, task.input_mean, task.input_std, min(draw, self.count - lo))
        self._outs_start = rng.bit_generator.state
        self._kept: Columns | None = None
        if self.count and self.count <= draw:  # one chunk of lengths: drawn already
            outs = lengths(rng, task.output_mean, task.output_std, self.count)
            self._kept = self._rows(np.concatenate(kept), 0, ins, outs)

    def _rows(self, times: np.ndarray, index: int, ins: np.ndarray, outs: np.ndarray
              ) -> Columns:
        n = len(times)
        rows = (times, np.full(n, self.order, dtype=np.int16),
                np.arange(index, index + n, dtype=np.int32), ins.astype(np.int32),
                outs.astype(np.int32))
        if n > 1 and not bool(np.all(times[1:] >= times[:-1])):  # times given whole, unsorted
            by = np.argsort(times, kind="stable")  # ties by index
            rows = tuple(c[by] for c in rows)  # type: ignore[assignment]
        return rows

    def chunks(self) -> Iterator[Columns]:
        """The task's rows from its first, a chunk at a time."""
        if self._kept is not None:
            yield self._kept
            return
        task, lengths = self.task, self._lengths
        ins, outs = _generator(self._ins_start), _generator(self._outs_start)
        left, index = self.count, 0
        for times in self._arrivals(self.order, task, _generator(self._start)):
            n = min(len(times), left)
            if n == 0:
                continue
            yield self._rows(np.asarray(times[:n], dtype=np.float64), index,
                             lengths(ins, task.input_mean, task.input_std, n),
                             lengths(outs, task.output_mean, task.output_std, n))
            left -= n
            index += n
            if not left:
                return


def _cut(columns: Columns, at: int) -> tuple[Columns, Columns]:
    head = tuple(c[:at] for c in columns)
    tail = tuple(c[at:] for c in columns)
    return head, tail  # type: ignore[return-value]


def _join(parts: list[Columns]) -> Columns:
    return tuple(np.concatenate([p[c] for p in parts]) for c in range(5))  # type: ignore[return-value]


def merged(tasks: list[TaskDraws]) -> Iterator[Columns]:
    """Every task's rows in (arrival, task order, index) order, a batch at a time."""
    readers = [t.chunks() for t in tasks]
    buffers: list[Columns | None] = [None] * len(tasks)
    live = [t.count > 0 for t in tasks]  # rows still to be drawn

    def pull(j: int) -> None:
        got = next(readers[j], None)
        if got is None:
            live[j] = False
            return
        old = buffers[j]
        buffers[j] = got if old is None or not len(old[0]) else _join([old, got])

    while True:
        for j in range(len(tasks)):
            if live[j] and (buffers[j] is None or not len(buffers[j][0])):  # type: ignore[index]
                pull(j)
        # No later row of a live task comes before its last buffered arrival.
        ends = [b[0][-1] for j, b in enumerate(buffers) if live[j] and b is not None]
        horizon = min(ends) if ends else np.inf
        out: list[Columns] = []
        for j, b in enumerate(buffers):
            if b is None or not len(b[0]):
                continue
            at = len(b[0]) if horizon == np.inf else int(np.searchsorted(b[0], horizon, "left"))
            if at:
                head, buffers[j] = _cut(b, at)
                out.append(head)
        if out:
            rows = _join(out)
            by = np.lexsort((rows[2], rows[1], rows[0]))  # time, task order, index
            yield tuple(c[by] for c in rows)  # type: ignore[misc]
        elif not any(live):
            return
        else:  # the earliest live task's buffer is all ties at the horizon: draw past them
            for j, b in enumerate(buffers):
                if live[j] and b is not None and b[0][-1] == horizon:
                    pull(j)


class MergedRows:
    """Rows ``[lo, hi)`` of the merge, read in order (``StreamRows``'s source). Reading back
    restarts the draws: a run reads each row once, forward."""

    def __init__(self, tasks: list[TaskDraws]) -> None:
        self.tasks = tasks
        self.size = sum(t.count for t in tasks)
        self._restart()

    def _restart(self) -> None:
        self._batches = merged(self.tasks)
        self._at = 0  # the row number of the buffer's first row
        self._buffer: Columns = tuple(np.zeros(0) for _ in range(5))  # type: ignore[assignment]

    def fresh(self) -> MergedRows:
        """Another reader of the same rows (the draws' states are shared, not their position)."""
        out = MergedRows.__new__(MergedRows)
        out.tasks, out.size = self.tasks, self.size
        out._restart()
        return out

    def __call__(self, lo: int, hi: int) -> Columns:
        hi = min(hi, self.size)
        if lo < self._at:
            self._restart()
        buffer = self._buffer
        while self._at + len(buffer[0]) < hi:
            batch = next(self._batches)
            buffer = batch if not len(buffer[0]) else _join([buffer, batch])
        drop = lo - self._at
        if drop > 0:
            _, buffer = _cut(buffer, drop)
            self._at = lo
        self._buffer = buffer
        return tuple(c[:hi - lo] for c in buffer)  # type: ignore[return-value]


def poisson_chunks(rate: float, duration: float, draw: int = DRAW
                   ) -> Callable[[int, TaskSpec, np.random.Generator], Iterator[np.ndarray]]:
    """``poisson_until``'s arrival times (hfx/workloads/load.py) as chunks: blocks of
    ``max(16, rate·duration)`` exponential gaps, each block's times counted from the end of the
    one before, until a time reaches ``duration``; the last block is drawn to its end."""
    block = max(16, int(rate * duration))

    def chunks(order: int, task: TaskSpec, rng: np.random.Generator) -> Iterator[np.ndarray]:
        start, more = 0.0, True
        while more:
            total: float | None = None
            for lo in range(0, block, draw):
                gaps = rng.exponential(1.0 / rate, min(draw, block - lo))
                sums = cumsum_from(total, gaps)
                total = float(sums[-1])
                if more:
                    times = start + sums
                    yield times[times < duration]
                    more = bool(times[-1] < duration)
            start += total  # type: ignore[operator]
    return chunks


def counted_chunks(rate: float, count: int, draw: int = DRAW
                   ) -> Callable[[int, TaskSpec, np.random.Generator], Iterator[np.ndarray]]:
    """``count`` Poisson arrival times at ``rate`` from 0 (``np.cumsum`` of exponential gaps),
    as chunks."""
    def chunks(order: int, task: TaskSpec, rng: np.random.Generator) -> Iterator[np.ndarray]:
        total: float | None = None
        for lo in range(0, count, draw):
            sums = cumsum_from(total, rng.exponential(1.0 / rate, min(draw, count - lo)))
            total = float(sums[-1])
            yield sums
    return chunks
