# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
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
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from hfx.policies.views import ClusterView, Decision, Dispatch, InstanceView
from hfx.request import Request, RequestRecord
from hfx.stepmodel.latency import StepTimeModel

__all__ = ["ArrivalOrderPolicy", "ClusterView", "Decision", "Dispatch", "InstanceView", "Policy",
           "prefill_over", "ttft_lost"]


def ttft_lost(request: Request, model: StepTimeModel, now: float, cached: int = 0) -> bool:
    """Whether ``request`` misses its TTFT even if its prompt were prefilled alone, now (past
    ``cached`` tokens found in a prefix cache)."""
    assert request.slo is not None
    return now + prefill_over(model, request.prompt_len, cached) > \
        request.arrival + request.slo.ttft


def prefill_over(model: StepTimeModel, prompt_len: int, cached: int) -> float:
    """Eq. 1 for one prompt alone whose first ``cached`` tokens are in the prefix cache: the
    rest, c tokens, over them (Σc, Σc·(k + c), Σc·k, as the engine's step charges it)."""
    c = prompt_len - cached
    return model.prefill_time(c, c * (cached + c), c * cached)


# Compiled (hfx/native.py), open to policies written in Python (tests', a user's own).
@mypyc_attr(allow_interpreted_subclasses=True)
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


@mypyc_attr(allow_interpreted_subclasses=True)
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
