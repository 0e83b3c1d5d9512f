"""Model shapes: the hyperparameters of a Llama / Qwen2-family decoder, without torch.

A shape is what a Hugging Face ``config.json`` says about the architecture. Named shapes let a
random-weight model be built with no checkpoint at all: ``tiny`` for tests, and the published
shapes of Qwen2.5-0.5B and Qwen2.5-7B (their config.json files on the Hugging Face hub).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass(frozen=True, slots=True)
class ModelShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    model_type: str = "qwen2"  # qwen2: q/k/v projections carry a bias; llama: none
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"unsupported model_type {self.model_type!r}; "
                             f"supported: {', '.join(ARCHITECTURES)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def attention_bias(self) -> bool:
        return self.model_type == "qwen2"

    @property
    def num_parameters(self) -> int:
        h, i, kv = self.hidden_size, self.intermediate_size, self.num_key_value_heads
        attn = h * h * 2 + 2 * h * kv * self.head_dim
        if self.attention_bias:
            attn += h + 2 * kv * self.head_dim
        layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + emb + h

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelShape:
        """Read a Hugging Face config.json (transformers 4.x or 5.x field names)."""
        model_type = config.get("model_type", "llama")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"unsupported model_type {model_type!r} in config.json; "
                             f"supported: {', '.join(ARCHITECTURES)}")
        rope = config.get("rope_theta")
        if rope is None:
            rope = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        scaling = config.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope scaling {scaling!r} is not supported")
        eos = config.get("eos_token_id")
        try:
            return cls(
                vocab_size=int(config["vocab_size"]),
                hidden_size=int(config["hidden_size"]),
                intermediate_size=int(config["intermediate_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                num_attention_heads=int(config["num_attention_heads"]),
                num_key_value_heads=int(config.get("num_key_value_heads")
                                        or config["num_attention_heads"]),
                max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
                rope_theta=float(rope),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                model_type=model_type,
                eos_token_id=eos[0] if isinstance(eos, list) else eos,
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks {e.args[0]!r}") from None

    def to_hf_config(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(architectures=[ARCHITECTURES[self.model_type]], hidden_act="silu",
                   head_dim=self.head_dim, torch_dtype="bfloat16",
                   attention_bias=self.attention_bias)
        return out


SHAPES: dict[str, ModelShape] = {
    # Small enough that a test runs a forward pass in milliseconds; a vocabulary above the byte
    # tokenizer's 257 ids.
    "tiny": ModelShape(vocab_size=512, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=256),
    # The smallest model vLLM's CPU attention runs (head sizes 32, 64, 80, ...; tiny's 16 is
    # refused): 3.3M parameters, the vLLM tier's model.
    "mini": ModelShape(vocab_size=512, hidden_size=256, intermediate_size=768,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=256),
    # https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
    "qwen2.5-0.5b": ModelShape(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                               num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, tie_word_embeddings=True,
                               eos_token_id=151643),
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    "qwen2.5-7b": ModelShape(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                             num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                             max_position_embeddings=131072, eos_token_id=151643),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json; its "llama3" rope
    # scaling changes only the rotary frequencies' values, not the work, and is left out (the
    # engine refuses it). The shape of the shipped llama-3.1-8b@h200 profile
    # (bench/gpu/h200_profile_check.py measures it on an H200).
    "llama-3.1-8b": ModelShape(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                               num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=8, max_position_embeddings=131072,
                               rope_theta=500000.0, rms_norm_eps=1e-5, model_type="llama",
                               eos_token_id=128001),
}


def get_shape(name: str, **overrides: Any) -> ModelShape:
    try:
        shape = SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}") from None
    return replace(shape, **overrides) if overrides else shape
