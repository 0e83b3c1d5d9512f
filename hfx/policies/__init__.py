"""Dispatch policies, chosen by name. This file is the one registration point."""

from __future__ import annotations

from typing import Any

from hfx.policies.aladdin import Aladdin
from hfx.policies.base import ClusterView, Decision, Dispatch, InstanceView, Policy
from hfx.policies.hfx import HFXDispatcher
from hfx.policies.least_loaded import LeastLoaded
from hfx.policies.round_robin import RoundRobin
from hfx.policies.sa import SimulatedAnnealing
from hfx.policies.scorpio import Scorpio

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (HFXDispatcher, RoundRobin, LeastLoaded, Scorpio, Aladdin,
                        SimulatedAnnealing)
}


def make_policy(name: str, **params: Any) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from None


__all__ = ["POLICIES", "ClusterView", "Decision", "Dispatch", "InstanceView", "Policy",
           "make_policy"]
