"""From a ServeConfig to a running gateway: model, profile, cluster, Server, FastAPI app."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hfx.assembly import build_cluster
from hfx.backends.base import Backend, check_settings
from hfx.cluster.control import ControlPlane
from hfx.cluster.outliers import EjectionPolicy
from hfx.cluster.tenants import load_tenants
from hfx.config import ServeConfig
from hfx.engines import BACKENDS
from hfx.evaluation.calibration import ReplayEngine
from hfx.request import SLO
from hfx.serving.calibrator import LiveCalibrator
from hfx.serving.server import ServeOptions, Server
from hfx.stepmodel.latency import Profile
from hfx.workloads.tasks import TASKS

if TYPE_CHECKING:
    pass

def build_server(config: ServeConfig) -> Server:
    """The backend's fleet (``--engine``, hfx/backends/), the control plane over it, and the
    serving core the gateway answers from."""
    backend: Backend = BACKENDS.get_or_raise(config.engine)
    check_settings(config, BACKENDS)
    # Read first: a bad entry stops the server before any engine starts, naming it.
    tenants = load_tenants(config.tenants) if config.tenants else {}
    served = backend.serve(config)
    config, profile = served.config, served.profile
    try:
        ejection = EjectionPolicy(config.eject_after, config.eject_seconds,
                                  config.eject_max_seconds, config.eject_max_share)
        control = build_cluster(config, profile, served.engines, served.placement,
                                engine_planner=served.replay_planner, ejection=ejection)
        served.prepare(control)
    except BaseException:
        served.close()
        raise
    options = ServeOptions(
        model_name=served.model_name, max_model_len=served.max_model_len,
        default_slo=SLO(config.default_ttft_ms / 1e3, config.default_tpot_ms / 1e3),
        tasks={t.name: t.slo for t in TASKS.values()}, vocab_size=served.vocab_size,
        placeholder_text=served.placeholder_text, eos_token_id=served.eos_token_id,
        priority_levels=config.priorities, stream_interval=config.stream_interval,
        tenant_keys={key: spec.name for spec in tenants.values() for key in spec.api_keys})
    calibrator = None
    if served.calibrate:
        engine = ReplayEngine(served.replay_planner or config.planner or control.policy.planner,
                              served.replay_token_budget or config.max_num_batched_tokens,
                              config.max_num_seqs, profile.kv_capacity_tokens, profile.block_size)
        calibrator = _calibrator(config, control, profile, engine)
    server = Server(control, served.tokenizer, options, calibrator, tenants)
    server.placement = served.placement
    server.streams_at_front, server.fleet = served.streams_at_front, served.fleet
    server.services += served.services(control)
    _record(config, server)
    return server


def _record(config: ServeConfig, server: Server) -> None:
    """--record FILE: every request served, as a trace to replay."""
    if config.record is None:
        return
    from hfx.serving.recorder import Recorder

    calibrator = server.calibrator
    server.recorder = Recorder(config.record, server.control, config.record_prompts,
                               int(config.record_max_mb * (1 << 20)),
                               lambda: calibrator.last if calibrator is not None else None)
    server.services.append(server.recorder)


def _calibrator(config: ServeConfig, control: ControlPlane, profile: Profile,
                engine: ReplayEngine) -> LiveCalibrator | None:
    """The step-time calibration of a real-engine gateway, unless --calibrate-every 0; P/D
    requests cannot be replayed on one engine, so none there."""
    if not config.calibrate_every or config.mode == "pd":
        return None
    return LiveCalibrator(control, profile.model, engine, config.calibrate_every,
                          config.calibrate_window)
