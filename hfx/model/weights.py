"""Weights: Hugging Face checkpoint directories (config.json + safetensors) and random weights.

Nothing is downloaded: a checkpoint is a local directory. ``random_model`` builds a model of a
named shape with seeded random weights (the same seed gives the same weights on any machine), and
``save_checkpoint`` writes one in the Hugging Face layout, which both this loader and
``transformers`` read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hfx.model.shapes import ModelShape
from hfx.model.transformer import CausalLM

INIT_STD = 0.02  # transformers' initializer_range for Llama and Qwen2


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded, with the reason."""


def empty_model(shape: ModelShape, dtype: torch.dtype, device: str | torch.device) -> CausalLM:
    """Uninitialised parameters of ``dtype`` on ``device``: built on the meta device and cast
    there, so that nothing of another dtype is ever allocated (or touched) for real."""
    with torch.device("meta"):
        model = CausalLM(shape).to(dtype)
    return model.to_empty(device=device)


def random_model(shape: ModelShape, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> CausalLM:
    """A model with N(0, 0.02) weights and biases and unit norms, drawn in name order."""
    model = empty_model(shape, dtype, device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
    init_buffers(model, device)
    return model.eval()


def init_buffers(model: CausalLM, device: str | torch.device) -> None:
    # Non-persistent buffers are not in a checkpoint; rebuild them on the target device.
    shape = model.shape
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2).float() / shape.head_dim))
    model.rotary.inv_freq = inv.to(device)


def read_config(path: str | Path) -> ModelShape:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"{path}: no config.json")
    try:
        return ModelShape.from_hf_config(json.loads(cfg.read_text()))
    except (json.JSONDecodeError, ValueError) as e:
        raise CheckpointError(f"{cfg}: {e}") from None


def checkpoint_files(path: str | Path) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    return files


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in checkpoint_files(path):
        state.update(load_file(f))
    return state


def load_state(model: CausalLM, state: dict[str, torch.Tensor]) -> None:
    """Copy a checkpoint's tensors into ``model``; every parameter must be present."""
    state = dict(state)
    if model.lm_head is None:
        state.pop("lm_head.weight", None)  # tied to the embedding
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint does not match the model: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, p in own.items():
            t = state[name]
            if t.shape != p.shape:
                raise CheckpointError(f"{name}: checkpoint shape {tuple(t.shape)}, "
                                      f"model {tuple(p.shape)}")
            p.copy_(t)


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> CausalLM:
    """Load a Hugging Face checkpoint directory (config.json + *.safetensors)."""
    model = empty_model(read_config(path), dtype, device)
    load_state(model, read_state_dict(path))
    init_buffers(model, device)
    return model.eval()


def save_checkpoint(model: CausalLM, path: str | Path) -> Path:
    """Write config.json and model.safetensors (tied weights stored once, as transformers)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = model.shape.to_hf_config()
    config["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out
