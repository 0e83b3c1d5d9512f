"""Assembly: from a ``ClusterConfig`` to a control plane with its instances, policies, P/D links,
priority mapper and Scaler. ``hfx sim`` and ``hfx serve`` build their clusters here, so a setting
means the same in both; only the engines differ (simulated, real, in this process or Ray actors).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Sequence
from dataclasses import replace

from hfx.backends.local import LocalPlacement
from hfx.cluster.admission import AdmissionLimits
from hfx.cluster.control import ControlPlane
from hfx.cluster.fair_share import FairShare
from hfx.cluster.instance import Instance
from hfx.cluster.monitor import Monitor
from hfx.cluster.outliers import EjectionPolicy
from hfx.cluster.placement import EngineFactory, Placement
from hfx.cluster.provisioner import LoadModel, Plan, Provisioner
from hfx.cluster.scaler import Scaler, ScalerConfig
from hfx.cluster.slo_mapper import PriorityMapper, PriorityRange
from hfx.cluster.tenants import load_tenants
from hfx.cluster.tl_manager import TLManager
from hfx.config import ClusterConfig
from hfx.engine import EngineConfig, EngineCore, Role, SimExecutor
from hfx.engine.executor import StepNoise
from hfx.engine.planners import PLANNERS
from hfx.policies import make_pd_policies, make_policy
from hfx.policies.prefix_index import PrefixIndex
from hfx.stepmodel.latency import Profile
from hfx.stepmodel.roofline import kv_bytes_from_meta, weight_bytes_per_device
from hfx.workloads.load import priority_levels
from hfx.workloads.tasks import WORKLOADS, TaskSpec

DEFAULT_WEIGHT_BYTES = 15.2e9  # Qwen2.5-7B in bf16, one device: the seeds' model (Table 2)


def engine_config(config: ClusterConfig, profile: Profile, planner: str) -> EngineConfig:
    capacity = config.kv_capacity_tokens or profile.kv_capacity_tokens
    return EngineConfig(
        num_kv_blocks=max(1, capacity // config.block_size),
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        planner=planner,
        planner_params=dict(config.planner_params),
        engine_runs=config.engine_runs,
        prefix_caching=config.prefix_caching,
    )


def make_tl_manager(config: ClusterConfig, profile: Profile) -> TLManager:
    kv = config.kv_bytes_per_token or kv_bytes_from_meta(profile.meta)
    if kv is None:
        raise ValueError(f"profile {profile.name} records no model config: give "
                         "--kv-bytes-per-token for P/D mode")
    tp = int(profile.meta.get("model", {}).get("tp", 1))
    return TLManager(kv, tp, config.devices_per_node, config.intra_node_gbps,
                     config.inter_node_gbps, config.link_latency)


def make_mapper(config: ClusterConfig, tasks: Sequence[TaskSpec]) -> PriorityMapper | None:
    """HFX-PM with each priority's nominal SLO ± 25% (HyperFlexis §7.3), when priorities are on;
    the priorities split ``tasks`` by TTFT strictness."""
    if not config.priorities:
        return None
    _, nominal = priority_levels(list(tasks), config.priorities)
    return PriorityMapper([PriorityRange.around(s) for s in nominal], config.priority_window)


def sim_engines(profile: Profile, noise_cv: float = 0.0, seed: int = 0) -> EngineFactory:
    """Engines whose SimExecutor waits out the profile's predicted step time, times a seeded
    noise factor of coefficient of variation ``noise_cv`` (each engine its own stream, by
    creation order)."""
    made = itertools.count()

    def make(ecfg: EngineConfig) -> EngineCore:
        noise = StepNoise(noise_cv, (seed, next(made))) if noise_cv else None
        return EngineCore(ecfg, SimExecutor(profile.model, noise))

    return make


def make_scaler(config: ClusterConfig, profile: Profile, control: ControlPlane,
                ecfg: EngineConfig, placement: Placement, seed: int = 0) -> Scaler:
    """The Scaler for ``config``, attached to ``control``; ``placement`` starts the instances
    it adds."""
    initial = len(control.instances)
    assert config.max_instances is not None
    weights = weight_bytes_per_device(profile.meta) or DEFAULT_WEIGHT_BYTES
    load = (LoadModel.from_file(config.load_profile, weights) if config.load_profile
            else LoadModel(weights))
    warm = config.warm_pool if config.warm_pool is not None else config.max_instances - initial
    provisioner = Provisioner(load, config.weight_path, warm, config.cold_start,
                              config.d2d_failure_rate, seed)
    scfg = ScalerConfig(min_instances=initial, max_instances=config.max_instances,
                        interval=config.scaling_interval, scale_out_ratio=config.scale_out_ratio,
                        scale_in_ratio=config.scale_in_ratio,
                        wait_threshold=config.wait_threshold,
                        wait_per_class=config.wait_indicator == "per-class",
                        cooldown=config.scaling_cooldown)

    def launch(iid: int, role: Role, plan: Plan) -> Awaitable[Instance]:
        return placement.launch(iid, replace(ecfg, role=role), plan)

    scaler = Scaler(scfg, control, provisioner, launch, placement.describe_launch)
    control.attach_scaler(scaler)
    return scaler


def fair_share(config: ClusterConfig) -> FairShare | None:
    """``--fair-share``: tenants' shares, weighted as ``--tenants`` says."""
    if config.fair_share == "off":
        return None
    specs = load_tenants(config.tenants) if config.tenants else {}
    return FairShare({name: spec.weight for name, spec in specs.items()}, config.fair_share,
                     reserve=config.fair_reserve)


def build_cluster(config: ClusterConfig, profile: Profile,
                  make_engine: EngineFactory | None = None,
                  placement: Placement | None = None, *,
                  tasks: Sequence[TaskSpec] = WORKLOADS["four-task"],
                  seed: int = 0, engine_planner: str | None = None,
                  ejection: EjectionPolicy | None = None) -> ControlPlane:
    """The control plane and its instances for ``config`` (not started): simulated engines by
    default, or whatever ``make_engine`` builds (a real executor), in this process unless a
    ``placement`` puts them elsewhere (Ray actors). ``tasks`` are what priorities map onto
    (HFX-PM); ``seed`` drives the provisioner's simulated D2D failures; ``engine_planner`` is
    the planner that stands for engines that are not ours (vLLM's scheduler: ``vllm``), which
    the dispatcher predicts for; ``ejection``: when broken streams take an instance out of
    dispatch (serving; Envoy's defaults if not given)."""
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
    planner = PLANNERS.get_or_raise(engine_planner or ecfg.planner)
    instances = placement.initial([(i, replace(ecfg, role=role)) for i, role in enumerate(roles)])
    control = ControlPlane(instances, policy, profile,
                           step_model=profile.model.scaled(1.0 + config.predictor_error),
                           monitor=Monitor(config.monitor_interval),
                           mapper=make_mapper(config, tasks), migrator=migrator, tl_manager=tl,
                           admission=AdmissionLimits(config.max_queued, config.max_wait),
                           mixed_steps=planner.mixes_decodes, step_tokens=planner.step_tokens(ecfg),
                           prefix=PrefixIndex(config.block_size) if config.prefix_caching
                           else None, ejection=ejection, fair=fair_share(config))
    if config.max_instances is not None:
        make_scaler(config, profile, control, ecfg, placement, seed)
    return control
