"""Dispatch policies, chosen by name. This file is the one registration point.

Entries are import paths, resolved on first use: listing or validating names (every CLI start)
imports no policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from hfx.registry import Registry, lazy_exports, load

if TYPE_CHECKING:  # the lazy names' types: without them, mypy and mypyc see Any
    from hfx.policies.base import ClusterView, Decision, Dispatch, InstanceView, Policy  # noqa: F401

POLICIES: Registry[type[Policy]] = Registry("policy", {
    "hfx": "hfx.policies.hfx:HFXDispatcher",
    "rr": "hfx.policies.round_robin:RoundRobin",
    "least-loaded": "hfx.policies.least_loaded:LeastLoaded",
    "scorpio": "hfx.policies.scorpio:Scorpio",
    "aladdin": "hfx.policies.aladdin:Aladdin",
    "sa": "hfx.policies.sa:SimulatedAnnealing",
    "slos-serve": "hfx.policies.slos_serve:SLOsServe",
    "polyserve": "hfx.policies.polyserve:PolyServe",
    # The cache-aware routers users would put in front of vLLM instead (issue 47).
    "llm-d": "hfx.policies.llm_d:LLMD",
    "dynamo": "hfx.policies.dynamo:DynamoKV",
    "sglang": "hfx.policies.sglang:SGLangCacheAware",
    "prefix-aware": "hfx.policies.prefix_aware:PrefixAware",
})


# P/D mode: name → (P-stage dispatcher, D-stage migrator). Round robin and least-loaded run the
# same rule in both stages (the seeds' RR-PD baseline, HyperFlexis §8.1.2).
PD_POLICIES: dict[str, tuple[str, str]] = {
    "hfx": ("hfx.policies.hfx_pd:HFXPrefillDispatcher", "hfx.policies.hfx_pd:HFXMigrator"),
    "rr-pd": ("hfx.policies.round_robin:RoundRobin",) * 2,
    "least-loaded": ("hfx.policies.least_loaded:LeastLoaded",) * 2,
}


def _integral(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with integral floats as ints. Flags and configs give every number as a float
    (``window=40`` is 40.0); a compiled policy (hfx/native.py) takes no float for an ``int``
    parameter, and an int is a float parameter's value as well."""
    return {k: int(v) if isinstance(v, float) and v.is_integer() else v
            for k, v in params.items()}


def make_pd_policies(name: str, **params: Any) -> tuple[Policy, Policy]:
    """The two stages of a P/D policy; ``params`` go to the P-stage dispatcher."""
    if name == "rr":
        name = "rr-pd"
    try:
        dispatcher, migrator = (cast("type[Policy]", load(path)) for path in PD_POLICIES[name])
    except KeyError:
        raise ValueError(f"unknown P/D policy {name!r}; choose one of "
                         f"{', '.join(PD_POLICIES)}") from None
    try:
        return dispatcher(**_integral(params)), migrator()
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from None


def make_policy(name: str, **params: Any) -> Policy:
    cls = POLICIES.get_or_raise(name)
    try:
        return cls(**_integral(params))
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from None


_BASE = ("ClusterView", "Decision", "Dispatch", "InstanceView", "Policy")
# The base types, re-exported without importing them (and the engine) at package import.
__getattr__ = lazy_exports(__name__, dict.fromkeys(_BASE, "hfx.policies.base"))


__all__ = ["PD_POLICIES", "POLICIES", *_BASE, "make_pd_policies", "make_policy"]
