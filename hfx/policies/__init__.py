"""Dispatch policies, chosen by name. This file is the one registration point."""

from __future__ import annotations

from typing import Any

from hfx.policies.aladdin import Aladdin
from hfx.policies.base import ClusterView, Decision, Dispatch, InstanceView, Policy
from hfx.policies.hfx import HFXDispatcher
from hfx.policies.hfx_pd import HFXMigrator, HFXPrefillDispatcher
from hfx.policies.least_loaded import LeastLoaded
from hfx.policies.polyserve import PolyServe
from hfx.policies.round_robin import RoundRobin
from hfx.policies.sa import SimulatedAnnealing
from hfx.policies.scorpio import Scorpio
from hfx.policies.slos_serve import SLOsServe

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (HFXDispatcher, RoundRobin, LeastLoaded, Scorpio, Aladdin,
                        SimulatedAnnealing, SLOsServe, PolyServe)
}


# P/D mode: name → (P-stage dispatcher, D-stage migrator). Round robin and least-loaded run the
# same rule in both stages (the seeds' RR-PD baseline, seed 000 §8.1.2).
PD_POLICIES: dict[str, tuple[type[Policy], type[Policy]]] = {
    "hfx": (HFXPrefillDispatcher, HFXMigrator),
    "rr-pd": (RoundRobin, RoundRobin),
    "least-loaded": (LeastLoaded, LeastLoaded),
}


def make_pd_policies(name: str, **params: Any) -> tuple[Policy, Policy]:
    """The two stages of a P/D policy; ``params`` go to the P-stage dispatcher."""
    if name == "rr":
        name = "rr-pd"
    try:
        dispatcher, migrator = PD_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown P/D policy {name!r}; choose one of "
                         f"{', '.join(PD_POLICIES)}") from None
    try:
        return dispatcher(**params), migrator()
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from None


def make_policy(name: str, **params: Any) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from None


__all__ = [
    "PD_POLICIES",
    "POLICIES",
    "ClusterView",
    "Decision",
    "Dispatch",
    "InstanceView",
    "Policy",
    "make_pd_policies",
    "make_policy",
]
