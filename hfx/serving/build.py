"""From a ServeConfig to a running gateway: model, profile, cluster, Server, FastAPI app."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hfx.assembly import build_cluster
from hfx.cluster.control import ControlPlane
from hfx.config import ServeConfig
from hfx.evaluation.calibration import ReplayEngine
from hfx.model.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from hfx.request import SLO
from hfx.serving.calibrator import LiveCalibrator
from hfx.serving.engine_spec import EngineSpec
from hfx.serving.server import ServeOptions, Server
from hfx.stepmodel.latency import Profile, load_profile
from hfx.workloads.tasks import TASKS

if TYPE_CHECKING:
    from hfx.cluster.placement import Placement

SIM_PROFILE = "qwen2.5-7b@ascend-910b"
PLACEHOLDER_TEXT = " tok"  # what each token of the sim executor reads as
# vLLM 0.32's default max_num_batched_tokens for its OpenAI server on CPU: what the servers HFX
# starts use unless --max-num-batched-tokens is given (then passed to them). Servers attached
# with --backend may run another; give it as --max-num-batched-tokens.
VLLM_TOKEN_BUDGET = 2048


def _profile(config: ServeConfig, device: str, spec: EngineSpec) -> Profile:
    if config.profile is not None:
        return load_profile(config.profile)
    if config.executor == "sim":
        return load_profile(SIM_PROFILE)
    if config.checkpoint is None and config.shape == "tiny" and device == "cpu":
        return load_profile("tiny@cpu")
    from hfx.engine.profiler import Grid, profile_model

    print("measuring a step-time profile (hfx profile --quick) ...")
    return profile_model(spec.model(), Grid.quick(), config.kv_capacity_tokens,
                         config.block_size)


def _placement(config: ServeConfig, spec: EngineSpec, device: str) -> Placement | None:
    """Ray actors with --ray / --ray-address; this process otherwise (None)."""
    if not (config.ray or config.ray_address):
        return None
    from hfx.backends.ray.cluster import join_ray
    from hfx.backends.ray.instance import RayPlacement

    join_ray(config)
    return RayPlacement(spec, num_cpus=config.ray_cpus_per_instance,
                        num_gpus=1 if device.startswith("cuda") else 0)


def build_server(config: ServeConfig) -> Server:
    tokenizer: Tokenizer = ByteTokenizer()
    eos: int | None = None
    max_len, vocab = config.max_model_len, 1 << 31
    if config.engine == "vllm":
        return _build_vllm(config)
    if config.executor == "torch":
        from hfx.model.build import default_device
        from hfx.model.shapes import get_shape
        from hfx.model.weights import read_config

        device = config.device or default_device()
        spec = EngineSpec("torch", max_len, shape=config.shape, checkpoint=config.checkpoint,
                          dtype=config.dtype, device=device, weight_seed=config.weight_seed)
        # The gateway needs the config and the tokenizer; the weights load where engines run
        # (in this process on the first engine, or in each Ray actor).
        if config.checkpoint is not None:
            shape = read_config(config.checkpoint)
            name = Path(config.checkpoint).name
        elif config.shape is not None:
            shape, name = get_shape(config.shape), f"{config.shape}-random"
        else:
            raise ValueError("give a model shape or a checkpoint directory")
        tokenizer = load_tokenizer(config.checkpoint, shape.eos_token_id)
        eos = tokenizer.eos_token_id
        max_len, vocab = min(max_len, shape.max_position_embeddings), shape.vocab_size
        spec = replace(spec, max_model_len=max_len)
        profile = _profile(config, device, spec)
        spec = replace(spec, profile=profile)  # planners that pace by time read it
    else:
        device = "cpu"
        profile = _profile(config, device, EngineSpec("sim", max_len))
        spec = EngineSpec("sim", max_len, profile=profile)
        name = f"{profile.name.replace('@', '-')}-sim"  # no "@": clients read ids as HF names

    profile = replace(profile, kv_capacity_tokens=config.kv_capacity_tokens,
                      block_size=config.block_size)
    if config.kv_bytes_per_token is None and not profile.meta.get("model"):
        # A measured profile records no model config: P/D links then count tokens, not bytes.
        config = config.model_copy(update={"kv_bytes_per_token": 1})
    placement = _placement(config, spec, device)
    control = build_cluster(config, profile, spec, placement)
    if config.max_instances is not None and spec.holds_weights and placement is None:
        warm = (config.warm_pool if config.warm_pool is not None
                else config.max_instances - config.initial_instances)
        spec.prepare(config.weight_path, warm)  # what scaled-out instances copy from
    options = ServeOptions(
        model_name=config.served_model_name or name, max_model_len=max_len,
        default_slo=SLO(config.default_ttft_ms / 1e3, config.default_tpot_ms / 1e3),
        tasks={t.name: t.slo for t in TASKS.values()}, vocab_size=vocab,
        placeholder_text=PLACEHOLDER_TEXT if config.executor == "sim" else None,
        eos_token_id=eos, priority_levels=config.priorities,
        stream_interval=config.stream_interval)
    calibrator = None
    if config.executor == "torch":
        engine = ReplayEngine(config.planner or control.policy.planner,
                              config.max_num_batched_tokens, config.max_num_seqs,
                              profile.kv_capacity_tokens, profile.block_size)
        calibrator = _calibrator(config, control, profile, engine)
    server = Server(control, tokenizer, options, calibrator)
    server.placement = placement
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


def _build_vllm(config: ServeConfig) -> Server:
    """HFX over vLLM servers: the checkpoint gives the gateway its tokenizer and
    limits (the servers load the weights themselves); the profile is the dispatcher's view of
    their step times (--profile, else measured on all of them at start)."""
    import json

    from hfx.backends.vllm.build import vllm_placement
    from hfx.engine import Role

    if config.checkpoint is None:
        raise ValueError("--engine vllm needs --checkpoint: the model directory the servers "
                         "load, and where the gateway reads the tokenizer")
    hf = json.loads((Path(config.checkpoint) / "config.json").read_text())
    eos = hf.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    tokenizer = load_tokenizer(config.checkpoint, eos)
    max_len = min(config.max_model_len, int(hf.get("max_position_embeddings", 1 << 31)))
    vocab = int(hf["vocab_size"])
    name = config.served_model_name or Path(config.checkpoint).name
    placement = vllm_placement(config, name, max_len)
    roles = ([Role.PREFILL] * config.prefill + [Role.DECODE] * config.decode
             if config.mode == "pd" else [Role.COLOCATED] * config.instances)
    fleet = placement.prepare(list(enumerate(roles)))
    info = fleet[0].info
    try:
        if config.profile is not None:
            profile = load_profile(config.profile)
        else:
            from hfx.backends.vllm.profiler import VLLMGrid, profile_vllm

            print("measuring a step-time profile of the vLLM servers, all at once (hfx "
                  "profile --engine vllm; give --profile to skip) ...", flush=True)
            profile = profile_vllm([i.url for i in fleet], VLLMGrid.quick(), info.kv_total_blocks
                                   * info.block_size, info.block_size, config.checkpoint)
        # The dispatcher plans with the servers' own KV size.
        profile = replace(profile, kv_capacity_tokens=info.kv_total_blocks * info.block_size,
                          block_size=info.block_size)
        if not profile.meta.get("model"):
            config = config.model_copy(update={"kv_bytes_per_token": 1})
        # The ignore: initial's list[VLLMInstance] is no list[Instance] (invariant); Placement
        # (hfx/cluster/placement.py) should return Sequence[Instance].
        control = build_cluster(config, profile, None, placement)  # type: ignore[arg-type]
    except BaseException:
        for inst in fleet:
            if inst.process is not None:
                inst.process.kill()
        for warm in placement.warm:
            warm.kill()
        raise
    options = ServeOptions(
        model_name=name, max_model_len=max_len,
        default_slo=SLO(config.default_ttft_ms / 1e3, config.default_tpot_ms / 1e3),
        tasks={t.name: t.slo for t in TASKS.values()}, vocab_size=vocab,
        eos_token_id=eos, priority_levels=config.priorities,
        stream_interval=config.stream_interval)
    # vLLM's scheduler, as the replay simulates it: chunked prefill (V1) with its token budget.
    engine = ReplayEngine("chunked", config.max_num_batched_tokens or VLLM_TOKEN_BUDGET,
                          config.max_num_seqs, profile.kv_capacity_tokens, profile.block_size)
    server = Server(control, tokenizer, options, _calibrator(config, control, profile, engine))
    server.placement = placement
    _record(config, server)
    if placement.attached:
        from hfx.backends.vllm.healer import BackendHealer

        server.services.append(BackendHealer(control, placement, config.backend_check_interval))
    return server
