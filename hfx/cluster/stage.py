# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""A scheduling stage: one policy, the instances it sees, its wake-up timer.

Colocated serving has one stage (dispatch). P/D has two (HyperFlexis §5.1): the P-stage dispatcher
over the prefill instances and the D-stage Migrator over the decode instances. A stage calls its
policy whenever something may have changed — an arrival into its queue, a finished request while
it still queues work, a Monitor snapshot, an instance joining or draining, or the wake-up time the
policy asked for — and hands the decision to whoever applies it. Time is the running loop's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hfx.policies.base import ClusterView, Decision, Policy
from hfx.request import Request

Apply = Callable[[Decision, float], None]  # a decision and the time it was made


class Stage:
    def __init__(self, name: str, policy: Policy, view: ClusterView, apply: Apply) -> None:
        self.name = name
        self.policy = policy
        self.view = view  # the instances of this stage's role, updated in place
        self._apply = apply
        self._timer: asyncio.Handle | None = None
        self._timer_when = 0.0

    def enqueue(self, request: Request, now: float) -> None:
        self.policy.enqueue(request, now)

    def schedule(self) -> None:
        """Ask the policy now; apply its decision; arm the wake-up it asked for."""
        loop = asyncio.get_running_loop()
        now = self.view.now = loop.time()
        decision = self.policy.schedule(self.view)
        self._apply(decision, now)
        when = None if decision.wake_at is None else max(decision.wake_at, now)
        if self._timer is not None:
            if when == self._timer_when:
                return  # already armed for that time: a new timer would only churn the heap
            self._timer.cancel()
            self._timer = None
        if when is not None:
            # Its time kept here: uvloop's handle for a time already due has no when().
            self._timer, self._timer_when = loop.call_at(when, self._wake), when

    def _wake(self) -> None:
        self._timer = None  # fired: a decision asking for this same time must arm a new one
        self.schedule()

    def schedule_if_queued(self) -> None:
        if self.policy.num_queued():
            self.schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
