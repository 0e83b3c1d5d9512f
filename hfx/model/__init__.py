"""The real model: shapes (no torch needed), and — with the ``torch`` extra — a Llama/Qwen2
decoder over a paged KV cache, its weights, tokenizer and sampler."""

from hfx.model.shapes import SHAPES, ModelShape, get_shape

__all__ = ["SHAPES", "ModelShape", "get_shape"]
