"""Sampling parameters: how a real executor picks the next token.

A shared type: requests carry it, engines hand it to the executor, the model's sampler reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a real executor picks the next token. temperature 0 is greedy; a seed makes sampling
    reproducible whatever else shares the batch."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


GREEDY = SamplingParams()
