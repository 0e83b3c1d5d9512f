"""Dispatch policies, chosen by name. This file is the one registration point."""

from __future__ import annotations

from typing import Any

from hfx.policies.base import ClusterView, Decision, Dispatch, InstanceView, Policy
from hfx.policies.least_loaded import LeastLoaded
from hfx.policies.round_robin import RoundRobin

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (RoundRobin, LeastLoaded)}


def make_policy(name: str, **params: Any) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return cls(**params)


__all__ = ["POLICIES", "ClusterView", "Decision", "Dispatch", "InstanceView", "Policy",
           "make_policy"]
