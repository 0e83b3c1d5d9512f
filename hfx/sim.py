"""Simulate a cluster: the serving code on the virtual-time loop with SimExecutors.

``simulate(config)`` returns the result object of DESIGN.md "Contracts". The run is
deterministic for a config: the same seed gives the same JSON, except ``wall_seconds``.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

from tqdm import tqdm

from hfx.clock import run
from hfx.cluster.control import ControlPlane
from hfx.cluster.instance import Instance
from hfx.cluster.monitor import Monitor
from hfx.cluster.placement import EngineFactory, LocalPlacement, Placement
from hfx.cluster.provisioner import LoadModel, Provisioner
from hfx.cluster.scaler import Scaler, ScalerConfig
from hfx.cluster.slo_mapper import PriorityMapper, PriorityRange
from hfx.cluster.tl_manager import TLManager
from hfx.config import SimConfig
from hfx.engine import EngineConfig, EngineCore, Role, SimExecutor
from hfx.evaluation.metrics import distribution, summarize
from hfx.evaluation.workloads import load_workload, priority_levels, with_priorities, workload_tasks
from hfx.latency import Profile, load_profile
from hfx.policies import make_pd_policies, make_policy
from hfx.request import Outcome, Request
from hfx.roofline import kv_bytes_from_meta, weight_bytes_per_device


def resolve_profile(config: SimConfig) -> Profile:
    profile = load_profile(config.profile or f"{config.model}@{config.hardware}")
    if config.block_size != profile.block_size:
        profile = replace(profile, block_size=config.block_size)
    return profile


def engine_config(config: SimConfig, profile: Profile, planner: str) -> EngineConfig:
    capacity = config.kv_capacity_tokens or profile.kv_capacity_tokens
    return EngineConfig(
        num_kv_blocks=max(1, capacity // config.block_size),
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        planner=planner,
    )


STALL_SECONDS = 600.0  # plus the arrival span: far beyond any workload's drain time


def make_tl_manager(config: SimConfig, profile: Profile) -> TLManager:
    kv = config.kv_bytes_per_token or kv_bytes_from_meta(profile.meta)
    if kv is None:
        raise ValueError(f"profile {profile.name} records no model config: give "
                         "--kv-bytes-per-token for P/D mode")
    tp = int(profile.meta.get("model", {}).get("tp", 1))
    return TLManager(kv, tp, config.devices_per_node, config.intra_node_gbps,
                     config.inter_node_gbps, config.link_latency)


def make_mapper(config: SimConfig) -> PriorityMapper | None:
    """HFX-PM with each priority's nominal SLO ± 25% (seed 000 §7.3), when priorities are on."""
    if not config.priorities:
        return None
    _, nominal = priority_levels(workload_tasks(config.workload), config.priorities)
    return PriorityMapper([PriorityRange.around(s) for s in nominal], config.priority_window)


def load_requests(config: SimConfig) -> list[Request]:
    """The config's workload; with priorities, tasks carry a priority instead of an SLO."""
    requests = load_workload(config.workload, config.qps, config.seed, config.requests_per_task)
    if config.priorities and not config.workload.endswith((".jsonl", ".csv")):
        of_task, _ = priority_levels(workload_tasks(config.workload), config.priorities)
        requests = with_priorities(requests, of_task)
    return requests


def sim_engines(profile: Profile) -> EngineFactory:
    """Engines whose SimExecutor waits out the profile's predicted step time."""
    return lambda ecfg: EngineCore(ecfg, SimExecutor(profile.model))


def make_scaler(config: SimConfig, profile: Profile, control: ControlPlane,
                ecfg: EngineConfig, placement: Placement) -> Scaler:
    """The Scaler for ``config``; ``placement`` starts the instances it adds."""
    initial = len(control.instances)
    assert config.max_instances is not None
    weights = weight_bytes_per_device(profile.meta) or 15.2e9
    load = (LoadModel.from_file(config.load_profile, weights) if config.load_profile
            else LoadModel(weights))
    warm = config.warm_pool if config.warm_pool is not None else config.max_instances - initial
    provisioner = Provisioner(load, config.weight_path, warm, config.cold_start,
                              config.d2d_failure_rate, config.seed)
    scfg = ScalerConfig(min_instances=initial, max_instances=config.max_instances,
                        interval=config.scaling_interval, scale_out_ratio=config.scale_out_ratio,
                        scale_in_ratio=config.scale_in_ratio,
                        wait_threshold=config.wait_threshold, cooldown=config.scaling_cooldown)

    def launch(iid: int, role: Role, load_seconds: float) -> Awaitable[Instance]:
        return placement.launch(iid, replace(ecfg, role=role), load_seconds)

    return Scaler(scfg, control, provisioner, launch)


def build_cluster(config: SimConfig, profile: Profile,
                  make_engine: EngineFactory | None = None,
                  placement: Placement | None = None) -> ControlPlane:
    """The control plane and its instances for ``config`` (not started): simulated engines by
    default, or whatever ``make_engine`` builds (a real executor), in this process unless a
    ``placement`` puts them elsewhere (Ray actors)."""
    placement = placement or LocalPlacement(make_engine or sim_engines(profile))
    migrator, tl = None, None
    if config.mode == "pd":
        policy, migrator = make_pd_policies(config.policy, **config.policy_params)
        roles = [Role.PREFILL] * config.prefill + [Role.DECODE] * config.decode
        tl = make_tl_manager(config, profile)
    else:
        policy = make_policy(config.policy, **config.policy_params)
        roles = [Role.COLOCATED] * config.instances
    ecfg = engine_config(config, profile, config.planner or policy.planner)
    instances = placement.initial([(i, replace(ecfg, role=role)) for i, role in enumerate(roles)])
    control = ControlPlane(instances, policy, profile,
                           step_model=profile.model.scaled(1.0 + config.predictor_error),
                           monitor=Monitor(config.monitor_interval),
                           mapper=make_mapper(config), migrator=migrator, tl_manager=tl)
    if config.max_instances is not None:
        make_scaler(config, profile, control, ecfg, placement)
    return control


async def drive(control: ControlPlane, requests: list[Request], progress: str | None = None
                ) -> float:
    """Start ``control``, submit ``requests`` at their arrival times, wait until every one has
    an outcome, stop; returns the time the last one finished. ``progress`` labels a bar.

    Arrival times count from the start of the run: on the virtual loop that is time 0; on the
    ordinary loop (a real engine) they are shifted to the loop's clock, and so is the result;
    each request's arrival is then the moment it is submitted (timers fire up to ~1 ms late).
    """
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await control.start()
    if control.scaler is not None:
        control.scaler.start()
    bar = tqdm(total=len(requests), desc=progress, unit="req",
               disable=progress is None or None, leave=False)

    async def show_progress() -> None:
        while True:
            await asyncio.sleep(1.0)
            bar.update(control.num_done - bar.n)

    ticker = loop.create_task(show_progress()) if progress else None
    for req in requests:
        delay = t0 + req.arrival - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if t0:  # real clock: latency counts from receipt, as a server stamps it, not from
            req = replace(req, arrival=loop.time())  # when a late timer meant to send it
        control.submit(req)
    try:
        # A stalled engine would otherwise keep the Monitor ticking forever on a virtual clock.
        limit = STALL_SECONDS + (requests[-1].arrival if requests else 0.0)
        await asyncio.wait_for(control.wait_idle(), timeout=limit)
    except asyncio.TimeoutError:
        stuck = sum(r.outcome is Outcome.PENDING for r in control.records.values())
        raise RuntimeError(f"{stuck} requests still unfinished {limit:g} s after the last "
                           "arrival: the cluster stalled") from None
    end = loop.time() - t0
    if ticker is not None:
        ticker.cancel()
    bar.close()
    await control.stop()
    return end


async def run_cluster(config: SimConfig, requests: list[Request], profile: Profile,
                      progress: bool = False, make_engine: EngineFactory | None = None
                      ) -> tuple[ControlPlane, float]:
    """Drive ``requests`` through a fresh cluster on the running loop; returns the control plane
    (its records hold the outcome) and the time the last request finished."""
    control = build_cluster(config, profile, make_engine)
    label = f"{config.policy}@{config.qps:g}qps" if progress else None
    return control, await drive(control, requests, label)


@contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """A run creates millions of small, mostly acyclic objects (records, token times); the
    default gen-0 threshold of 700 makes the cyclic collector walk them over and over.
    Measured: -18% wall on a 60k-request run (docs/performance.md)."""
    old = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def instance_spans(control: ControlPlane) -> list[tuple[float, float]]:
    """(provisioned, released) of every instance the run had, for cost (seed Eq. 3)."""
    return [(control.active_since[i], control.released_at[i]) for i in control.active_since]


def scaling_summary(scaler: Scaler) -> dict:
    return {
        "instances_max_used": scaler.state.max_used,
        "scale_events": [asdict(e) for e in scaler.state.events],
        "instances_over_time": scaler.state.over_time,
    }


def pd_summary(control: ControlPlane) -> dict:
    """Migration figures of a P/D run: how many, and the delay from first token to KV arrival."""
    records = [r for r in control.records.values() if r.migrated_at is not None]
    delays = [r.migrated_at - r.first_token_time for r in records if r.first_token_time]
    assert control.tl is not None
    return {"prefill_instances": sum(i.role is Role.PREFILL for i in control.instances.values()),
            "migrations": len(records), "migration_delay": distribution(delays),
            "kv_bytes_moved": sum(link.bytes_moved for link in control.tl.links.values())}


def simulate(config: SimConfig, progress: bool = False) -> dict:
    """Run one simulated configuration; the result object of DESIGN.md "Contracts"."""
    wall0 = time.perf_counter()
    profile = resolve_profile(config)
    requests = load_requests(config)
    with _fewer_gc_passes():
        control, end = run(run_cluster(config, requests, profile, progress), virtual=True)
    spans = instance_spans(control)
    records = list(control.records.values())
    result = {
        "policy": config.policy,
        "workload": config.workload,
        "mode": config.mode,
        "qps": config.qps,
        "seed": config.seed,
        "instances": len(control.active_since) if control.scaler is None
        else len(control.instances) + len(control.retired),
        "profile": profile.name,
        **summarize(records, spans),
        "sim_seconds": end,
        "engine_steps": sum(inst.engine.num_steps for inst in
                            [*control.instances.values(), *control.retired.values()]),
        **(scaling_summary(control.scaler) if control.scaler is not None else {}),
        **(pd_summary(control) if config.mode == "pd" else {}),
        "config": config.model_dump(),
        "wall_seconds": time.perf_counter() - wall0,
    }
    return result
