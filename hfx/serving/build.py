"""From a ServeConfig to a running gateway: model, profile, cluster, Server, FastAPI app."""

from __future__ import annotations

from dataclasses import replace

from hfx.bench.workloads import TASKS
from hfx.config import ServeConfig, SimConfig
from hfx.latency import Profile, load_profile
from hfx.model.tokenizer import ByteTokenizer, Tokenizer
from hfx.request import SLO
from hfx.serving.server import ServeOptions, Server
from hfx.sim import build_cluster, sim_engines

SIM_PROFILE = "qwen2.5-7b@ascend-910b"
PLACEHOLDER_TEXT = " tok"  # what each token of the sim executor reads as


def _profile(config: ServeConfig, device: str, loaded) -> Profile:
    if config.profile is not None:
        return load_profile(config.profile)
    if config.executor == "sim":
        return load_profile(SIM_PROFILE)
    if config.checkpoint is None and config.shape == "tiny" and device == "cpu":
        return load_profile("tiny@cpu")
    from hfx.profiler import Grid, profile_model

    print("measuring a step-time profile (hfx profile --quick) ...")
    return profile_model(loaded, Grid.quick(), config.kv_tokens, config.block_size)


def build_server(config: ServeConfig) -> Server:
    tokenizer: Tokenizer = ByteTokenizer()
    eos: int | None = None
    max_len, vocab = config.max_model_len, 1 << 31
    if config.executor == "torch":
        from hfx.model.build import build_model, default_device, real_engine

        device = config.device or default_device()
        loaded = build_model(config.shape, config.checkpoint, config.dtype, device,
                             config.weight_seed)
        profile = _profile(config, device, loaded)
        tokenizer, eos = loaded.tokenizer, loaded.tokenizer.eos_token_id
        shape = loaded.model.shape
        max_len, vocab = min(max_len, shape.max_position_embeddings), shape.vocab_size
        name = loaded.name

        def make_engine(ecfg):
            return real_engine(loaded, replace(ecfg, max_model_len=max_len))
    else:
        profile = _profile(config, "cpu", None)
        name = f"{profile.name}-sim"
        sims = sim_engines(profile)

        def make_engine(ecfg):
            return sims(replace(ecfg, max_model_len=max_len))

    profile = replace(profile, kv_capacity_tokens=config.kv_tokens,
                      block_size=config.block_size)
    sim = SimConfig(policy=config.policy, instances=config.instances, mode=config.mode,
                    prefill=config.prefill, decode=config.decode, planner=config.planner,
                    priorities=config.priorities, block_size=config.block_size,
                    kv_capacity_tokens=config.kv_tokens, max_instances=config.max_instances,
                    kv_bytes_per_token=None if profile.meta.get("model") else 1)
    control = build_cluster(sim, profile, make_engine)
    options = ServeOptions(
        model_name=name, max_model_len=max_len,
        default_slo=SLO(config.default_ttft_ms / 1e3, config.default_tpot_ms / 1e3),
        tasks={t.name: t.slo for t in TASKS.values()}, vocab_size=vocab,
        placeholder_text=PLACEHOLDER_TEXT if config.executor == "sim" else None,
        eos_token_id=eos, priority_levels=config.priorities)
    return Server(control, tokenizer, options, profile.model)
