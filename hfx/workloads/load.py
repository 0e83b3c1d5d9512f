"""Workloads: the seeds' Table 1 tasks with Poisson arrivals, and trace files.

Table 1 (HyperFlexis §7.3) gives each task's SLO and the mean ± std of its input and output lengths
over 300 samples. The datasets themselves cannot be fetched here, so lengths are sampled from a
**log-normal distribution with the same mean and standard deviation** (lengths are positive and
right-skewed; sharegpt's std exceeds its mean, which a normal cannot represent without piling
mass at the clip), rounded to whole tokens and clipped to [1, MAX_LEN].

Arrivals (HyperFlexis §7.3): each task is a Poisson process at an equal share of the total QPS and
contributes the same number of requests (300 by default); the merged stream is sorted by time.
The seed fixes the whole stream; each task draws from its own generator, so adding a task to a
set does not change the others.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import overload

import numpy as np

from hfx.request import SLO, Request
from hfx.workloads.stream_rows import StreamRows
from hfx.workloads.task_draws import (
    DRAW,
    ArrivalChunks,
    MergedRows,
    TaskDraws,
    counted_chunks,
    lognormal_lengths,
    poisson_chunks,
)
from hfx.workloads.tasks import (
    BURSTY,
    DEFAULT_REQUESTS_PER_TASK,
    TIERED,
    TIERS,
    TTFTS,
    WORKLOADS,
    TaskSpec,
)
from hfx.workloads.traces import read_trace


def poisson_until(rng: np.random.Generator, rate: float, duration: float) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate`` on [0, ``duration``)."""
    times: list[np.ndarray] = []
    start = 0.0
    while True:  # draw in blocks: the count is only known in expectation
        block = start + np.cumsum(rng.exponential(1.0 / rate, max(16, int(rate * duration))))
        times.append(block[block < duration])
        if block[-1] >= duration:
            return np.concatenate(times)
        start = float(block[-1])


def generate(workload: str, qps: float, seed: int,
             requests_per_task: int = DEFAULT_REQUESTS_PER_TASK,
             duration: float | None = None) -> list[Request]:
    """The named task set at ``qps`` requests/s in total, sorted by arrival: ``requests_per_task``
    each (the seeds' finite runs), or with ``duration``, Poisson arrivals for that many seconds
    (a steady-state run)."""
    return list(stream(workload, qps, seed, requests_per_task, duration))


def stream(workload: str, qps: float, seed: int,
           requests_per_task: int = DEFAULT_REQUESTS_PER_TASK,
           duration: float | None = None) -> RequestStream:
    """``generate``'s requests, each built when it is read."""
    try:
        tasks = WORKLOADS[workload]
    except KeyError:
        raise ValueError(f"unknown workload {workload!r}; choose one of "
                         f"{', '.join(WORKLOADS)} or give a trace file (.jsonl, .csv)") from None
    if qps <= 0:
        raise ValueError(f"qps must be positive, got {qps}")
    if requests_per_task < 1:
        raise ValueError(f"requests_per_task must be >= 1, got {requests_per_task}")
    rate = qps / len(tasks)
    if duration is not None:  # poisson_until's times, a chunk at a time
        return RequestStream(tasks, [seed, 3], poisson_chunks(rate, duration))
    return RequestStream(tasks, [seed], counted_chunks(rate, requests_per_task))


ArrivalsOf = Callable[[int, TaskSpec, np.random.Generator], "np.ndarray | Sequence[float]"]


def _chunked(arrivals_of: ArrivalsOf | ArrivalChunks) -> ArrivalChunks:
    """``arrivals_of`` as chunks: its iterator, or its whole result as one chunk."""
    def chunks(order: int, task: TaskSpec, rng: np.random.Generator) -> Iterator[np.ndarray]:
        times = arrivals_of(order, task, rng)
        if isinstance(times, Iterator):
            yield from times
        else:
            yield np.asarray(times, dtype=np.float64)
    return chunks


class RequestStream(Sequence[Request]):
    """Each task's requests — arrival times from ``arrivals_of``, then Table 1 lengths, drawn
    from the task's own generator (``key`` + the task's name) — merged in arrival order (ties:
    task order, then index), each ``Request`` built when it is read. ``arrivals_of`` returns a
    task's times whole, or as an iterator of chunks; the rows are drawn a chunk at a time as
    the run reads them (hfx/workloads/task_draws.py): a 27 M-request run holds a few chunks,
    not five numbers a request (~600 MB) nor a ``Request`` each (~300 B)."""

    def __init__(self, tasks: Iterable[TaskSpec], key: list[int],
                 arrivals_of: ArrivalsOf | ArrivalChunks, draw: int = DRAW) -> None:
        self._tasks = tuple(tasks)
        draws = []
        for order, task in enumerate(self._tasks):
            rng = np.random.default_rng([key[0], zlib.crc32(task.name.encode()), *key[1:]])
            draws.append(TaskDraws(order, task, rng, _chunked(arrivals_of), lognormal_lengths,
                                   draw))
        self._source = MergedRows(draws)
        # The last arrival (a run's end is reckoned from it), without reading to the end.
        self.last_arrival = max((d.last for d in draws if d.count), default=0.0)
        self.rows = StreamRows([t.name for t in self._tasks], [t.slo for t in self._tasks], None,
                               self._source, self._source.size)

    def __len__(self) -> int:
        return self.rows.size

    @overload
    def __getitem__(self, i: int) -> Request: ...

    @overload
    def __getitem__(self, i: slice) -> list[Request]: ...

    def __getitem__(self, i: int | slice) -> Request | list[Request]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = self.rows.size
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("request index out of range")
        return self.rows.request(i)

    def with_priorities(self, of_task: dict[str, int]) -> RequestStream:
        """The same requests carrying their task's priority instead of an SLO
        (``with_priorities``)."""
        missing = next((t for t in self._tasks if t.name not in of_task), None)
        if missing is not None:
            raise ValueError(f"task {missing.name!r} has no priority")
        out = copy.copy(self)
        out._source = self._source.fresh()
        out.rows = self.rows.with_priorities([of_task[t.name] for t in self._tasks], out._source)
        return out


def _task_stream(tasks: Iterable[TaskSpec], key: list[int], arrivals_of: ArrivalsOf
                 ) -> list[Request]:
    """``RequestStream``'s requests as a list."""
    return list(RequestStream(tasks, key, arrivals_of))


# ---- priorities (HFX-PM, HyperFlexis §5.2, §7.3) -------------------------------------------------
def priority_levels(tasks: tuple[TaskSpec, ...] | list[TaskSpec], levels: int
                    ) -> tuple[dict[str, int], list[SLO]]:
    """Tasks in order of TTFT SLO (strictest first) split into ``levels`` priorities, 0 the
    most important; each priority's nominal SLO is the median of its tasks' Table 1 SLOs."""
    ordered = sorted(tasks, key=lambda t: (t.slo.ttft, t.slo.tpot, t.name))
    if not 1 <= levels <= len(ordered):
        raise ValueError(f"priorities must be between 1 and the number of tasks "
                         f"({len(ordered)}), got {levels}")
    of_task = {t.name: i * levels // len(ordered) for i, t in enumerate(ordered)}
    nominal = []
    for p in range(levels):
        group = [t.slo for t in ordered if of_task[t.name] == p]
        nominal.append(SLO(float(np.median([s.ttft for s in group])),
                           float(np.median([s.tpot for s in group]))))
    return of_task, nominal


def with_priorities(requests: list[Request], of_task: dict[str, int]) -> list[Request]:
    """The same requests carrying their task's priority instead of an SLO."""
    missing = next((r for r in requests if r.task not in of_task), None)
    if missing is not None:
        raise ValueError(f"request {missing.id}: task {missing.task!r} has no priority")
    return [replace(r, slo=None, priority=of_task[r.task]) for r in requests]


def ramp(qps: float, seed: int, until: float = 90.0, step: float = 20.0) -> list[Request]:
    """HyperFlexis §9.1 dynamic ramp on the four-task set: the lowest priority's client starts at
    0 s, the next every ``step`` seconds (P3 at 0, P2 at 20, P1 at 40, P0 at 60 s), each sending
    ``qps`` requests/s until ``until``. Requests carry Table 1 SLOs; use --priorities 4."""
    tasks = sorted(WORKLOADS["four-task"], key=lambda t: t.slo.ttft, reverse=True)

    def arrivals(order: int, task: TaskSpec, rng: np.random.Generator) -> np.ndarray:
        start = order * step
        n = int((until - start) * qps * 2) + 10
        times = start + np.cumsum(rng.exponential(1.0 / qps, n))
        return times[times < until]

    return _task_stream(tasks, [seed, 1], arrivals)


def phases(workload: str, schedule: list[tuple[float, float]], seed: int) -> list[Request]:
    """A task set whose total QPS follows ``schedule``: (duration s, qps) phases one after
    another, each task an equal share, Poisson within a phase (for bursty-load experiments)."""
    tasks = WORKLOADS[workload]

    def arrivals(order: int, task: TaskSpec, rng: np.random.Generator) -> list[float]:
        start, times = 0.0, []
        for duration, qps in schedule:
            t = start
            while True:
                t += rng.exponential(1.0 / (qps / len(tasks)))
                if t >= start + duration:
                    break
                times.append(t)
            start += duration
        return times

    return _task_stream(tasks, [seed, 2], arrivals)


def bursty(workload: str, qps: float, seed: int, duration: float) -> list[Request]:
    """The cycle of ``BURSTY[workload]`` at mean rate ``qps`` for ``duration`` seconds."""
    base, cycle = BURSTY[workload]
    schedule: list[tuple[float, float]] = []
    t = 0.0
    while t < duration:
        for length, scale in cycle:
            length = min(length, duration - t)
            if length > 0:
                schedule.append((length, qps * scale))
                t += length
    return phases(base, schedule, seed)


def tiered(workload: str, qps: float, seed: int, requests: int,
           duration: float | None = None) -> list[Request]:
    """Poisson arrivals at ``qps`` (``requests`` of them, or for ``duration`` seconds); each
    request's TPOT tier, TTFT and uniform lengths drawn independently (input uniform on
    [1, 2·mean], output likewise). Tasks are the tiers."""
    mean_in, mean_out = TIERED[workload]
    rng = np.random.default_rng([seed, zlib.crc32(workload.encode())])
    if duration is not None:
        arrivals = poisson_until(rng, qps, duration)
        requests = len(arrivals)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / qps, requests))
    tiers = rng.choice(len(TIERS), requests, p=[share for _, share in TIERS])
    ttfts = rng.choice(TTFTS, requests)
    ins = rng.integers(1, 2 * mean_in, requests, endpoint=True)
    outs = rng.integers(1, 2 * mean_out, requests, endpoint=True)
    out = []
    for i in range(requests):
        tpot = TIERS[tiers[i]][0]
        out.append(Request(f"r{i}", float(arrivals[i]), int(ins[i]), int(outs[i]),
                           SLO(float(ttfts[i]), tpot), f"tpot{round(tpot * 1000)}ms"))
    return out


# ---- trace files -----------------------------------------------------------------------------
def load_trace(path: str | Path) -> list[Request]:
    """Read a trace in HFX's own columns, JSONL or CSV (fields: arrival [s], input_len,
    output_len, and optionally ttft [s], tpot [s], task, priority, tenant, id); requests sorted by
    arrival. A row's SLO is its own, else its Table 1 task's; one with only a priority keeps
    it. (hfx/workloads/traces.py reads this and the public formats.)"""
    return read_trace(path, "hfx")
