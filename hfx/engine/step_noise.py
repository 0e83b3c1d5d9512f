# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Multiplicative step-time noise for the simulated executor, drawn once a simulated step.

In the compiled set (hfx/native.py): a step's draw went through four Python frames (the draw,
``random``'s log-normal and normal draws); here it is one compiled call that takes the same
uniforms from the same stream and gives the same factor, bit for bit.
"""

from __future__ import annotations

import math
import random

# random.NV_MAGICCONST, computed as the random module computes it.
_NV_MAGICCONST = 4 * math.exp(-0.5) / math.sqrt(2.0)


class StepNoise:
    """Multiplicative step-time noise: each step takes the model's time × a log-normal factor of
    mean 1 and coefficient of variation ``cv``, seeded. Without it the dispatcher, predicting
    with the same model, would be an oracle; the cv is the real engine's measured
    spread between repeats of one step (bench/engine/step_noise.py, docs/performance.md)."""

    def __init__(self, cv: float, seed: int | tuple[int, ...]) -> None:
        if not 0 <= cv < math.inf:
            raise ValueError(f"step-time noise cv must be finite and >= 0, got {cv}")
        self.cv = cv
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._mu = -self._sigma ** 2 / 2  # a factor of mean exactly 1
        self._rng = random.Random(repr(seed))  # str seeds hash stably across processes
        self._ahead: list[float] = []  # drawn and given back, the next on top

    def factor(self) -> float:
        if self._ahead:
            return self._ahead.pop()
        return lognormal(self._rng, self._mu, self._sigma) if self.cv else 1.0

    def put_back(self, factors: list[float]) -> None:
        """Factors drawn and not used (the cut end of a decode run): drawn again, in order."""
        self._ahead.extend(reversed(factors))


def lognormal(rng: random.Random, mu: float, sigma: float) -> float:
    """``rng.lognormvariate(mu, sigma)``: the same arithmetic on the same uniforms (CPython's
    Kinderman–Monahan ``normalvariate``), so a seed gives the same run compiled or not and as
    before; tests/test_latency.py checks it against the running Python's own."""
    draw = rng.random
    while True:
        u1 = draw()
        u2 = 1.0 - draw()
        z = _NV_MAGICCONST * (u1 - 0.5) / u2
        zz = z * z / 4.0
        if zz <= -math.log(u2):
            break
    return math.exp(mu + z * sigma)
