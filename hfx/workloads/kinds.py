"""The kinds of workload, in one registry (``KINDS``): a name given as ``--workload`` is answered
by the first kind that takes it. A new kind is a class here and a line in ``KINDS``; loading,
the configuration's check and help, and ``hfx list`` read the registry.

Nothing here imports numpy at import time: the configuration (and so the CLI's start) reads
this module; what draws requests is imported when it draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hfx.workloads.tasks import (
    BURSTY,
    DEFAULT_REQUESTS_PER_TASK,
    TASKS,
    TIERED,
    WORKLOADS,
    TaskSpec,
)

if TYPE_CHECKING:
    from hfx.request import Request

TRACE_SUFFIXES = (".jsonl", ".csv")


@dataclass(frozen=True, slots=True)
class Draw:
    """What a workload is drawn with: the rate and seed, and how long or how many."""

    qps: float
    seed: int
    requests_per_task: int
    duration: float | None = None  # a steady-state stream of this many seconds
    trace_format: str = "auto"
    slo_map: str | None = None
    time_scale: float = 1.0
    trace_qps: float | None = None


class Kind(Protocol):
    def takes(self, workload: str) -> bool: ...

    def describe(self) -> str: ...  # for --help and hfx list

    def tasks(self, workload: str) -> tuple[TaskSpec, ...]: ...  # the Table 1 tasks it draws

    def requests(self, workload: str, draw: Draw) -> list[Request]: ...

    # Whether each request's output length is drawn apart from its prompt, given its task (the
    # blind bound's premise, hfx/evaluation/bound.py).
    def outputs_apart(self) -> bool: ...


class TaskSets:
    """The papers' task sets: each task a Poisson stream at an equal share of the rate."""

    def takes(self, workload: str) -> bool:
        return workload in WORKLOADS

    def describe(self) -> str:
        return f"task set ({', '.join(WORKLOADS)})"

    def tasks(self, workload: str) -> tuple[TaskSpec, ...]:
        return WORKLOADS[workload]

    def outputs_apart(self) -> bool:
        return True

    def requests(self, workload: str, draw: Draw) -> list[Request]:
        from hfx.workloads.load import generate

        return generate(workload, draw.qps, draw.seed, draw.requests_per_task, draw.duration)


class Ramp:
    """HyperFlexis §9.1's priority ramp on the four-task set."""

    def takes(self, workload: str) -> bool:
        return workload == "ramp"

    def describe(self) -> str:
        return "ramp (the priority ramp of HyperFlexis §9.1; qps is per client)"

    def tasks(self, workload: str) -> tuple[TaskSpec, ...]:
        return WORKLOADS["four-task"]

    def outputs_apart(self) -> bool:
        return True

    def requests(self, workload: str, draw: Draw) -> list[Request]:
        from hfx.workloads.load import ramp

        if draw.duration is not None:
            raise ValueError("ramp: the ramp sets its own arrivals; --duration applies to task "
                             "sets")
        return ramp(draw.qps, draw.seed)


class Tiered:
    """PolyServe §5.1's setting: TPOT tiers, uniform lengths."""

    def takes(self, workload: str) -> bool:
        return workload in TIERED

    def describe(self) -> str:
        return (f"{', '.join(TIERED)} (PolyServe's setting, PolyServe §5.1; 4 × "
                "requests-per-task requests)")

    def tasks(self, workload: str) -> tuple[TaskSpec, ...]:
        return tuple(TASKS.values())

    def outputs_apart(self) -> bool:
        return True

    def requests(self, workload: str, draw: Draw) -> list[Request]:
        from hfx.workloads.load import tiered

        return tiered(workload, draw.qps, draw.seed, 4 * draw.requests_per_task, draw.duration)


class Bursty:
    """A task set whose rate cycles (ours): 30 s at half the mean, 10 s at 2.5×."""

    def takes(self, workload: str) -> bool:
        return workload in BURSTY

    def describe(self) -> str:
        return f"{', '.join(BURSTY)} (four-task, 30 s at half the rate, 10 s at 2.5×)"

    def tasks(self, workload: str) -> tuple[TaskSpec, ...]:
        return WORKLOADS[BURSTY[workload][0]]

    def outputs_apart(self) -> bool:
        return True

    def requests(self, workload: str, draw: Draw) -> list[Request]:
        from hfx.workloads.load import bursty

        duration = draw.duration
        if duration is None:  # finite: whole cycles, as many as the task set's requests take
            base, cycle = BURSTY[workload]
            period = sum(length for length, _ in cycle)
            span = draw.requests_per_task * len(WORKLOADS[base]) / draw.qps
            duration = period * max(1, round(span / period))
        return bursty(workload, draw.qps, draw.seed, duration)


# Workloads whose prompts repeat (issue 46; hfx/workloads/sessions.py draws them).
REPEATING = ("chat-sessions", "shared-prompts", "agent-loops")


class Repeating:
    """Multi-turn chat, shared system prompts, agent tool loops: requests that name their
    content by block hashes, for a prefix cache to reuse. One task each, named as the kind."""

    def takes(self, workload: str) -> bool:
        return workload in REPEATING

    def describe(self) -> str:
        return (f"{', '.join(REPEATING)} (prompts that repeat: multi-turn chat, shared system "
                "prompts, agent tool loops; requests-per-task requests, or --duration)")

    def tasks(self, workload: str) -> tuple[TaskSpec, ...]:
        from hfx.workloads.sessions import TASK_SPECS

        return (TASK_SPECS[workload],)

    def outputs_apart(self) -> bool:
        return False

    def requests(self, workload: str, draw: Draw) -> list[Request]:
        from hfx.workloads.sessions import generate

        return generate(workload, draw.qps, draw.seed, draw.requests_per_task, draw.duration)


class Traces:
    """A trace file, in any format hfx/workloads/traces.py reads."""

    def takes(self, workload: str) -> bool:
        return workload.endswith(TRACE_SUFFIXES)

    def describe(self) -> str:
        return "a trace file (.jsonl/.csv)"

    def tasks(self, workload: str) -> tuple[TaskSpec, ...]:
        return tuple(TASKS.values())

    def outputs_apart(self) -> bool:
        return False

    def requests(self, workload: str, draw: Draw) -> list[Request]:
        from hfx.workloads.traces import parse_slo_map, read_trace

        if draw.duration is not None:
            raise ValueError(f"{workload}: a trace sets its own arrivals; --duration applies to "
                             "task sets")
        return read_trace(workload, draw.trace_format,
                          parse_slo_map(draw.slo_map) if draw.slo_map else None,
                          draw.time_scale, draw.trace_qps)


# The one registration point, in the order names are tried.
KINDS: tuple[Kind, ...] = (TaskSets(), Ramp(), Tiered(), Bursty(), Repeating(), Traces())


def kind_of(workload: str) -> Kind:
    """The kind that takes this name, or a ValueError that lists what would."""
    for kind in KINDS:
        if kind.takes(workload):
            return kind
    raise ValueError(f"unknown workload {workload!r}; choose a {describe()}")


def describe() -> str:
    """Every kind, for --help and errors."""
    return ", ".join(kind.describe() for kind in KINDS[:-1]) + ", or " + KINDS[-1].describe()


def load_workload(workload: str, qps: float, seed: int,
                  requests_per_task: int = DEFAULT_REQUESTS_PER_TASK,
                  duration: float | None = None, trace_format: str = "auto",
                  slo_map: str | None = None, time_scale: float = 1.0,
                  trace_qps: float | None = None) -> list[Request]:
    """The requests of any kind of workload: a task set (with ``duration``, a steady-state
    stream of that many seconds), the priority ramp, a tiered or bursty set, sessions, or a
    trace file."""
    draw = Draw(qps, seed, requests_per_task, duration, trace_format, slo_map, time_scale,
                trace_qps)
    return kind_of(workload).requests(workload, draw)


def workload_tasks(workload: str) -> tuple[TaskSpec, ...]:
    """The Table 1 tasks a workload draws from (all six for a trace file)."""
    return kind_of(workload).tasks(workload)
