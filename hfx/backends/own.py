"""The ``hfx`` backend: HFX's own engine core, with the PyTorch executor (``--executor torch``)
or the simulated one (``sim``), on this process's loop or in Ray actors (``--ray``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from hfx.backends.base import Served
from hfx.backends.engine_spec import EngineSpec
from hfx.config import ProfileConfig, ServeConfig
from hfx.model.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from hfx.stepmodel.latency import Profile, load_profile

if TYPE_CHECKING:
    from hfx.cluster.control import ControlPlane
    from hfx.cluster.placement import Placement

SIM_PROFILE = "qwen2.5-7b@ascend-910b"
PLACEHOLDER_TEXT = " tok"  # what each token of the sim executor reads as


class OwnEngine:
    """HFX's own engine core (PyTorch or simulated executor), in this process or Ray actors."""

    section = None  # the model's and the fleet's settings, which every backend shares

    def serve(self, config: ServeConfig) -> Served:
        if config.backend:
            raise ValueError("--backend attaches to running servers: --engine vllm; the hfx "
                             "engine runs its instances itself")
        tokenizer: Tokenizer = ByteTokenizer()
        eos: int | None = None
        max_len, vocab = config.max_model_len, 1 << 31
        if config.executor == "torch":
            from hfx.model.build import default_device
            from hfx.model.shapes import get_shape
            from hfx.model.weights import read_config

            device = config.device or default_device()
            spec = EngineSpec("torch", max_len, shape=config.shape, checkpoint=config.checkpoint,
                              dtype=config.dtype, device=device, weight_seed=config.weight_seed)
            # The gateway needs the config and the tokenizer; the weights load where engines
            # run (in this process on the first engine, or in each Ray actor).
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
            # A measured profile records no model config: P/D links then count tokens.
            config = config.model_copy(update={"kv_bytes_per_token": 1})
        placement = _placement(config, spec, device)

        def prepare(control: ControlPlane) -> None:
            if config.max_instances is not None and spec.holds_weights and placement is None:
                warm = (config.warm_pool if config.warm_pool is not None
                        else config.max_instances - config.initial_instances)
                spec.prepare(config.weight_path, warm)  # what scaled-out instances copy from

        return Served(config, config.served_model_name or name, tokenizer, max_len, vocab, eos,
                      profile, spec, placement,
                      placeholder_text=PLACEHOLDER_TEXT if config.executor == "sim" else None,
                      calibrate=config.executor == "torch", prepare=prepare,
                      fleet=f"{config.executor} executor")

    def profile(self, config: ProfileConfig) -> Profile:
        """The engine's steps timed on HyperFlexis Appendix A's grid, fitted."""
        try:
            from hfx.engine.profiler import Grid, profile_model
            from hfx.model.build import build_model
        except ImportError as e:
            raise ValueError(f"hfx profile needs the torch extra ({e}); install the CPU build "
                             "with: pip install torch==2.13.0 && pip install -e '.[torch]'"
                             ) from None
        loaded = build_model(config.shape, config.checkpoint, config.dtype, config.device,
                             config.weight_seed)
        grid = Grid.quick() if config.quick else Grid.full()
        if config.repeats is not None:
            grid = replace(grid, repeats=config.repeats)
        return profile_model(loaded, grid, config.kv_tokens, config.block_size, progress=True)


OWN_ENGINE = OwnEngine()


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
