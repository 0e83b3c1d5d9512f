"""A Llama / Qwen2-family decoder that reads and writes a paged KV cache.

RMSNorm, rotary position embeddings (the non-interleaved "rotate half" form), grouped-query
attention and a SwiGLU MLP, with parameter names identical to Hugging Face ``transformers``'
``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` so that a checkpoint's state dict loads as it is.

All tokens of a step run through the linear layers as one flat batch ([T, hidden]); only
attention looks at sequences one by one (a prefill chunk against its cached prefix) or as one
padded batch (decodes). Every layer's new K/V is written to the cache at ``slot_mapping`` before
attention reads it back through the sequence's block table, so prefill, chunked prefill,
recompute after preemption and decode are the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hfx.model.shapes import ModelShape


@dataclass(slots=True)
class PrefillSpan:
    """One sequence's prompt tokens in this step: rows [start, end) of the flat batch."""

    start: int
    end: int
    first_pos: int  # position of the chunk's first token (tokens already cached before it)
    slots: torch.Tensor  # [first_pos + (end - start)] cache slots of the whole context


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Decoding sequences of similar context length, attended in one padded call: rows
    ``start``..``end`` of the flat batch."""

    start: int
    end: int
    slots: torch.Tensor  # [b, width] context slots, padded with 0 to the group's longest
    mask: torch.Tensor  # [b, 1, 1, width] True where a slot is real


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot each new token's K/V is written to
    prefills: list[PrefillSpan]
    decodes: list[DecodeGroup] = field(default_factory=list)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()  # as transformers: normalise in float32, scale in the model's dtype
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    inv_freq: torch.Tensor  # a buffer (register_buffer): Module.__getattr__ is untyped

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim]."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            shape.num_attention_heads, shape.num_key_value_heads, d)
        bias = shape.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rotary(self.q_proj(x).view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        # cache: [2, num_slots, kv_heads, head_dim]
        cache[0].index_copy_(0, meta.slot_mapping, k)
        cache[1].index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        for span in meta.prefills:
            n = span.end - span.start
            keys = cache[0][span.slots].transpose(0, 1)[None]  # [1, kv_heads, ctx, d]
            values = cache[1][span.slots].transpose(0, 1)[None]
            queries = q[span.start:span.end].transpose(0, 1)[None]  # [1, heads, n, d]
            if span.first_pos == 0:
                o = F.scaled_dot_product_attention(queries, keys, values, is_causal=True,
                                                   enable_gqa=True)
            else:  # a chunk after a cached prefix: query i sees keys up to first_pos + i
                ctx = span.first_pos + n
                mask = (torch.arange(ctx, device=x.device)[None, :]
                        <= torch.arange(span.first_pos, ctx, device=x.device)[:, None])
                o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                                   enable_gqa=True)
            out[span.start:span.end] = o[0].transpose(0, 1)
        for group in meta.decodes:
            keys = cache[0][group.slots].transpose(1, 2)  # [b, kv_heads, width, d]
            values = cache[1][group.slots].transpose(1, 2)
            queries = q[group.start:group.end, :, None, :]  # [b, heads, 1, d]
            o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=group.mask,
                                               enable_gqa=True)
            out[group.start:group.end] = o[:, :, 0, :]
        return self.o_proj(out.view(t, -1))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h, i = shape.hidden_size, shape.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class CausalLM(nn.Module):
    """``forward`` computes hidden states for a flat batch; ``logits`` projects chosen rows."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.model = Backbone(shape)
        self.rotary = Rotary(shape.head_dim, shape.rope_theta)
        self.lm_head = (None if shape.tie_word_embeddings
                        else nn.Linear(shape.hidden_size, shape.vocab_size, bias=False))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                caches: list[torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, cache in zip(self.model.layers, caches, strict=True):
            x = layer(x, cos, sin, cache, meta)
        return self.model.norm(x)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
