"""Token sampling: greedy, or temperature with nucleus (top-p) truncation.

A sequence with a seed draws from a generator seeded by (seed, position), so its tokens do not
depend on what else shares the batch, on preemption, or on which instance decodes it.
"""

from __future__ import annotations

import torch

from hfx.sampling import SamplingParams

_SEED_STRIDE = 1_000_003  # a prime: (seed, position) pairs map to distinct generator seeds
_SEED_RANGE = 2**63  # torch generator seeds are 64-bit: fold any request seed into range


def sample(logits: torch.Tensor, params: list[SamplingParams], positions: list[int],
           generator: torch.Generator | None = None) -> list[int]:
    """logits: [B, vocab] float32; positions: each row's position (tokens before it)."""
    tokens = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.temperature == 0.0:
            continue
        probs = torch.softmax(logits[i] / p.temperature, dim=-1)
        if p.top_p < 1.0:
            probs = _top_p(probs, p.top_p)
        gen = generator
        if p.seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(
                (p.seed * _SEED_STRIDE + positions[i]) % _SEED_RANGE)
        tokens[i] = int(torch.multinomial(probs.cpu(), 1, generator=gen))
    return tokens


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(0) - sorted_probs  # mass of the tokens ranked above each
    drop = before >= top_p
    drop[0] = False  # the most likely token always stays, however small top_p is
    sorted_probs[drop] = 0.0
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()
