"""The real model: shapes (no torch needed), and — with the ``torch`` extra — a Llama/Qwen2
decoder over a paged KV cache, its weights, tokenizer and sampler.

The decoder (transformer.py) has Hugging Face's parameter names, so a checkpoint loads as it is,
and reads and writes the engine's paged KV cache through each sequence's block table, so
prefill, chunked prefill, recompute after preemption and decode are the same code
(hfx/engine/torch_executor.py runs it). It is checked against ``transformers`` with the same
weights (tests/test_torch_executor.py). The sampler draws per position from per-request seeds,
so a request resumed on another instance continues exactly (greedy or seeded).

Fast scaling (weight_manager.py; HyperFlexis §6 "Fast Scaling"): every running instance can
publish its tensors in one named shared-memory segment (a picklable ``WeightHandle``), and a new
instance copies them out (``fill_weights(model, path, WeightSources(...))``), falling back to
the checkpoint on disk when the peer is gone or does not match; ``OffloadedWeights`` is the
host-memory path. CUDA IPC between GPU processes is not built. ``hfx serve`` scales out with
these, not a modelled wait: hfx/backends/engine_spec.py builds the new engine by the
provisioner's path (bench/engine/serve_scale_out.py measures decision → first token per path).
"""

from hfx.model.shapes import SHAPES, ModelShape, get_shape

__all__ = ["SHAPES", "ModelShape", "get_shape"]
