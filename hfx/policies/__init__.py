"""Dispatch policies, chosen by name. This file is the one registration point.

Entries are import paths, resolved on first use: listing or validating names (every CLI start)
imports no policy.

A policy (base.py) is a plain object the control plane calls; it never awaits, never reads a
wall clock and never reaches into an engine. It implements ``enqueue``, ``schedule`` (→ a
``Decision``: dispatches, rejections, a wake-up time), ``num_queued`` and ``withdraw`` (drop a
queued request that was aborted or shed), and may hear ``on_finished`` and
``on_instance_removed``. What it sees and returns (views.py: ``InstanceView``, ``ClusterView``,
``Decision``, ``Dispatch``) is compiled with the engine under ``hfx native``; the policies stay
Python. ``ClusterView.version`` moves when the fleet changes a snapshot, an instance's
acceptance or the membership, so a policy may keep what it derives from the views (its shadows,
``accepting()``'s list) until then; the live tallies (``outstanding``) are read from the views
directly. In P/D, ``PD_POLICIES`` pairs a P-stage dispatcher with a D-stage Migrator.

Shared pieces:

- shadow.py: the dispatcher's estimate of each instance (in-flight requests and their SLOs,
  decode context, KV promised, free sequence slots), corrected by each Monitor snapshot;
  ``Shadows.follow`` re-syncs them only when the view's version moves.
- slo_queue.py (Q_R, by TPOT then arrival, or start tag with fair shares), maturity.py (Q_W,
  instances by maturity time, a heap with lazy deletion, for the dispatcher and the Migrator),
  output_length.py (per-task running mean and std, or ``oracle``), deadline_queue.py (SCORPIO's
  per-instance queue in TTFT-deadline order).

What a policy sees of the prefix caches (issue 47): ``ClusterView.cached(request)`` gives, per
instance, the prompt tokens it holds cached, from the control plane's ``PrefixIndex``
(prefix_index.py). The index is fed by each engine's block manager for the simulator and the
own engine, by each vLLM server's KV events for the servers HFX starts, and estimated from
routing for ``--backend`` servers, Ray-placed servers and a server whose event stream went
silent (the source is on ``/metrics`` as ``hfx_prefix_index_source``). A malformed or
out-of-order event is dropped and counted (``hfx_kv_events``), never guessed into the index.
HFX's dispatcher predicts each prompt's prefill past what the instance holds (``prefill_over``)
and leaves a request for the instance that holds more of it while its first token is still
likely in time there (``HFXDispatcher.elsewhere``); such a request is parked (parking.py), so
instances that hold less of it skip it in their scans of Q_R until the verdict's inputs move.
The cache-aware routers (cache_router.py, llm_d.py, dynamo.py, sglang.py, prefix_aware.py)
route at arrival onto vLLM's ``chunked`` engine, each from its own source and defaults
(docs/peers.md).

HFX's dispatcher (hfx.py) states its reading of the seed in its docstring. Two of its rules,
with their reasons: its token budget is also capped by the engine's free ``max_num_seqs`` slots
(without the cap, dispatched work queued inside the engine, outside the maturity model); and
hopeless requests are served only when no feasible request is queued (serving them with each
batch's leftover budget took capacity from feasible requests at overload). The readings of
SLOs-Serve and PolyServe are in slos_serve.py, polyserve.py and the engine's slo_paced.py and
tpot_chunked.py.
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
    # A reference, not a contender: PolyServe's tiers with their sizes fixed offline.
    "tier-split": "hfx.policies.tier_split:TierSplit",
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
