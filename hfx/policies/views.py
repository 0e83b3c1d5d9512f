# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""What a policy sees (``InstanceView``, ``ClusterView``) and what it returns (``Decision``,
``Dispatch``), compiled with the engine (hfx/native.py; re-exported by hfx/policies/base.py).

They cross between the compiled control plane and every policy on each decision: a
``Decision`` and a ``Dispatch`` per request, a view's tallies moved per dispatch and finish.
As Python dataclasses each construction ran Python code and each field the control plane read
or wrote went through a generic attribute lookup (issue 31). The policies stay Python and use
them unchanged. The hot ones write their ``__init__`` out: the one dataclasses generates is
Python even compiled (tests/test_native.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from hfx.engine.sequence import Role
from hfx.engine.stats import InstanceStats
from hfx.request import Request
from hfx.stepmodel.latency import Profile
from hfx.stepmodel.step_time import StepTimeModel


@dataclass(init=False)
class InstanceView:
    """One instance as a policy sees it."""

    id: int
    role: Role
    stats: InstanceStats  # the Monitor's latest snapshot
    outstanding: int  # dispatched here and not yet finished (live tally)
    outstanding_tokens: int  # prompt + max tokens of those requests
    accepting: bool  # False while draining

    def __init__(self, id: int, role: Role, stats: InstanceStats, outstanding: int = 0,
                 outstanding_tokens: int = 0, accepting: bool = True) -> None:
        self.id = id
        self.role = role
        self.stats = stats
        self.outstanding = outstanding
        self.outstanding_tokens = outstanding_tokens
        self.accepting = accepting


class CacheMatch(Protocol):
    """The control plane's index of the instances' prefix caches
    (hfx/policies/prefix_index.py)."""

    def match(self, request: Request) -> dict[int, int]: ...


_NO_MATCH: dict[int, int] = {}


@dataclass(init=False)
class ClusterView:
    now: float
    instances: list[InstanceView]
    step_model: StepTimeModel  # the dispatcher's predictions (may differ from the executor's)
    profile: Profile
    # The engines' steps that prefill also decode their running batch (BatchPlanner
    # .mixes_decodes): a first token then comes a decode step later than the prefill alone.
    mixed_steps: bool
    # The engines' per-step token budget when they chunk prompts into it whatever their
    # deadlines (BatchPlanner.step_tokens: vLLM's scheduler); None when prompts run whole or
    # are paced by deadlines.
    step_tokens: int | None
    # Moved on by whoever owns the views (the fleet) when a snapshot, an instance's acceptance
    # or the membership changes — not the live tallies (outstanding). A policy may keep what it
    # derives from the snapshots until it moves: at 1,000 instances an O(N) pass per call was
    # the dispatcher's cost.
    version: int
    # What each instance's prefix cache holds (None: prefix caching is off).
    prefix: CacheMatch | None
    # Each active tenant's share of the fleet's sequences while two or more are active (empty:
    # none kept), the requests each runs (live), and how many of an instance's free sequences
    # a tenant running its share or more may not take: FairShare.shares, .running, .reserve.
    fair_shares: dict[str, float]
    # Fair shares of scope "fleet" (hfx/cluster/fair_share.py): the tenants past their share,
    # whose requests wait behind the others' whatever their class (FairShare.past_share);
    # None: scope "class", or no fair shares.
    fair_past: frozenset[str] | None
    fair_running: Mapping[str, int]
    fair_reserve: int

    def __init__(self, now: float, instances: list[InstanceView], step_model: StepTimeModel,
                 profile: Profile, mixed_steps: bool = False, version: int = 0,
                 prefix: CacheMatch | None = None, step_tokens: int | None = None) -> None:
        self.now = now
        self.instances = instances
        self.step_model = step_model
        self.profile = profile
        self.mixed_steps = mixed_steps
        self.step_tokens = step_tokens
        self.version = version
        self.prefix = prefix
        self.fair_shares: dict[str, float] = {}
        self.fair_past: frozenset[str] | None = None
        self.fair_running: Mapping[str, int] = {}
        self.fair_reserve = 0
        self._accepting: dict[Role | None, tuple[int, list[InstanceView]]] = {}

    def accepting(self, role: Role | None = None) -> list[InstanceView]:
        """The instances taking new work (of ``role``); one list per version — do not modify
        it."""
        hit = self._accepting.get(role)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        found = [i for i in self.instances if i.accepting and (role is None or i.role is role)]
        self._accepting[role] = (self.version, found)
        return found

    def cached(self, request: Request) -> dict[int, int]:
        """Tokens of ``request``'s prompt each instance holds in its prefix cache (absent:
        none); do not modify it."""
        return _NO_MATCH if self.prefix is None else self.prefix.match(request)

    def changed(self) -> None:
        """A snapshot, an acceptance or the membership changed."""
        self.version += 1


@dataclass(init=False)
class Dispatch:
    request: Request
    instance: int
    best_effort: bool  # placed although its SLO is predicted lost

    def __init__(self, request: Request, instance: int, best_effort: bool = False) -> None:
        self.request = request
        self.instance = instance
        self.best_effort = best_effort


@dataclass(init=False)
class Decision:
    dispatch: list[Dispatch]
    reject: list[Request]
    wake_at: float | None  # call schedule() again at this time

    def __init__(self, dispatch: list[Dispatch] | None = None, reject: list[Request] | None = None,
                 wake_at: float | None = None) -> None:
        self.dispatch = [] if dispatch is None else dispatch
        self.reject = [] if reject is None else reject
        self.wake_at = wake_at
