"""Building a real engine: model (checkpoint or random shape), tokenizer, executor, engine core."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hfx.model.shapes import get_shape
from hfx.model.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from hfx.model.transformer import CausalLM
from hfx.model.weights import load_checkpoint, random_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """bfloat16 on a GPU; float32 on CPU, where bfloat16 matmuls are slower (no native units)."""
    if name is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


@dataclass(slots=True)
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    name: str  # what /v1/models and profiles call it


def build_model(shape: str | None = "tiny", checkpoint: str | Path | None = None,
                dtype: str | None = None, device: str | None = None,
                seed: int = 0) -> LoadedModel:
    """A checkpoint directory when given, else random weights of a named shape."""
    device = device or default_device()
    torch_dtype = resolve_dtype(dtype, device)
    if checkpoint is not None:
        model = load_checkpoint(checkpoint, torch_dtype, device)
        return LoadedModel(model, load_tokenizer(checkpoint, model.shape.eos_token_id),
                           Path(checkpoint).name)
    if shape is None:
        raise ValueError("give a model shape or a checkpoint directory")
    model = random_model(get_shape(shape), seed, torch_dtype, device)
    tokenizer: Tokenizer = ByteTokenizer()
    if model.shape.vocab_size < ByteTokenizer.vocab_size:
        raise ValueError(f"shape {shape!r} has too small a vocabulary for the byte tokenizer")
    return LoadedModel(model, tokenizer, f"{shape}-random")


def write_random_checkpoint(shape: str, out: str | Path, seed: int = 0,
                            dtype: str = "float32") -> Path:
    """Random weights of a named shape as a Hugging Face checkpoint directory, with the byte
    tokenizer as tokenizer.json: what another engine (vLLM) loads when nothing can be
    downloaded, reading and writing text exactly as HFX's gateway does."""
    from hfx.model.tokenizer import write_byte_tokenizer
    from hfx.model.weights import save_checkpoint

    model_shape = get_shape(shape)
    if model_shape.vocab_size < ByteTokenizer.vocab_size:
        raise ValueError(f"shape {shape!r} has too small a vocabulary for the byte tokenizer")
    model = random_model(model_shape, seed, resolve_dtype(dtype, "cpu"), "cpu")
    path = save_checkpoint(model, out)
    write_byte_tokenizer(path, model_shape.max_position_embeddings)
    return path
