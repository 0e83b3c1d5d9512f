"""The policy interface: how a dispatch policy sees the cluster and what it decides.

A policy keeps its own queue and state. The control plane calls ``enqueue`` on arrival and
``schedule`` whenever something may have changed (an arrival, a finished request, a monitor
snapshot, or the wake-up time the policy asked for). ``schedule`` returns a ``Decision``: which
queued requests go to which instance, which are rejected, and when to be called again.
Policies never read a wall clock and never reach into engines: time is ``view.now``, load is
the monitor's snapshot and the control plane's own tallies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hfx.engine import Role
from hfx.engine.stats import InstanceStats
from hfx.request import Request, RequestRecord
from hfx.stepmodel.latency import Profile, StepTimeModel


@dataclass(slots=True)
class InstanceView:
    """One instance as a policy sees it."""

    id: int
    role: Role
    stats: InstanceStats  # the Monitor's latest snapshot
    outstanding: int = 0  # dispatched here and not yet finished (live tally)
    outstanding_tokens: int = 0  # prompt + max tokens of those requests
    accepting: bool = True  # False while draining


@dataclass(slots=True)
class ClusterView:
    now: float
    instances: list[InstanceView]
    step_model: StepTimeModel  # the dispatcher's predictions (may differ from the executor's)
    profile: Profile
    # The engines' steps that prefill also decode their running batch (BatchPlanner
    # .mixes_decodes): a first token then comes a decode step later than the prefill alone.
    mixed_steps: bool = False
    # Moved on by whoever owns the views (the fleet) when a snapshot, an instance's acceptance
    # or the membership changes — not the live tallies (outstanding). A policy may keep what it
    # derives from the snapshots until it moves: at 1,000 instances an O(N) pass per call was
    # the dispatcher's cost.
    version: int = 0
    _accepting: dict[Role | None, tuple[int, list[InstanceView]]] = field(
        default_factory=dict, repr=False)

    def accepting(self, role: Role | None = None) -> list[InstanceView]:
        """The instances taking new work (of ``role``); one list per version — do not modify
        it."""
        hit = self._accepting.get(role)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        found = [i for i in self.instances if i.accepting and (role is None or i.role is role)]
        self._accepting[role] = (self.version, found)
        return found

    def changed(self) -> None:
        """A snapshot, an acceptance or the membership changed."""
        self.version += 1


def ttft_lost(request: Request, model: StepTimeModel, now: float) -> bool:
    """Whether ``request`` misses its TTFT even if its prompt were prefilled alone, now."""
    assert request.slo is not None
    return now + model.prefill_one(request.prompt_len) > request.arrival + request.slo.ttft


@dataclass(slots=True)
class Dispatch:
    request: Request
    instance: int
    best_effort: bool = False  # placed although its SLO is predicted lost


@dataclass(slots=True)
class Decision:
    dispatch: list[Dispatch] = field(default_factory=list)
    reject: list[Request] = field(default_factory=list)
    wake_at: float | None = None  # call schedule() again at this time


class Policy(ABC):
    """A dispatch policy. Subclasses set ``name`` and register in hfx/policies/__init__.py."""

    name: ClassVar[str]
    planner: ClassVar[str] = "prefill-first"  # the engine batch planner this policy brings

    def __init__(self, **params: Any) -> None:
        if params:
            raise ValueError(f"policy {self.name!r} takes no parameters {sorted(params)}")

    @abstractmethod
    def enqueue(self, request: Request, now: float) -> None: ...

    @abstractmethod
    def schedule(self, view: ClusterView) -> Decision: ...

    @abstractmethod
    def num_queued(self) -> int: ...

    @abstractmethod
    def withdraw(self, request_id: str) -> bool:
        """Drop a queued request (its client went away, or admission control shed it), so that
        it is neither dispatched nor counted any more; False if it is not queued here."""

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:  # noqa: B027
        """A request left the cluster (finished, aborted or failed)."""

    def on_instance_removed(self, instance_id: int) -> None:  # noqa: B027
        """The instance drains: requests this policy queued for it must go elsewhere."""

    def on_unplaced(self, request: Request, instance_id: int) -> None:  # noqa: B027
        """A placement this policy decided did not take (a P/D migration found no KV free on
        the decode instance after all): ``request`` is not on ``instance_id`` and will be
        offered to the policy again."""


class ArrivalOrderPolicy(Policy):
    """A policy that takes requests in arrival order from one queue (``_queue``)."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def enqueue(self, request: Request, now: float) -> None:
        self._queue.append(request)

    def num_queued(self) -> int:
        return len(self._queue)

    def withdraw(self, request_id: str) -> bool:
        for i, req in enumerate(self._queue):  # O(queue): bounded by admission control
            if req.id == request_id:
                del self._queue[i]
                return True
        return False
