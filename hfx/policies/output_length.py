# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Output-length prediction, shared by the policies that need it (SCORPIO, SA, Aladdin, HFX's
KV reservation).

``history`` mode keeps a per-task running mean and standard deviation of the observed output
lengths (Welford's update) — SA §5.1 models each task's lengths as a Gaussian fitted to
what it has seen; SCORPIO's classifier and Aladdin's historical mean are replaced by the same
per-task statistics. A task with too few observations falls back to the mean over all tasks,
then to ``prior``. ``oracle`` mode returns the request's true output length, for ablations.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from hfx.request import Request


@dataclass(slots=True)
class _Moments:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0


class OutputLengthPredictor:
    MODES = ("history", "oracle")

    def __init__(self, mode: str = "history", prior: float = 128.0, min_samples: int = 5) -> None:
        if mode not in self.MODES:
            raise ValueError(f"unknown output-length mode {mode!r}; choose one of {self.MODES}")
        self.mode = mode
        self.prior = prior  # tokens, before anything is observed
        self.min_samples = min_samples
        self._tasks: dict[str, _Moments] = {}
        self._all = _Moments()

    def observe(self, task: str, length: int) -> None:
        """A request of ``task`` finished with ``length`` output tokens."""
        self._tasks.setdefault(task, _Moments()).add(length)
        self._all.add(length)

    def _moments(self, task: str) -> _Moments | None:
        m = self._tasks.get(task)
        if m is not None and m.n >= self.min_samples:
            return m
        return self._all if self._all.n >= self.min_samples else None

    def predict(self, request: Request) -> float:
        """Expected output tokens of ``request``."""
        if self.mode == "oracle":
            return float(request.max_tokens)
        m = self._moments(request.task)
        return self.prior if m is None else max(1.0, m.mean)

    def sample(self, request: Request, rng: random.Random) -> int:
        """A draw from the task's fitted Gaussian (SA §5.1), at least 1 token."""
        if self.mode == "oracle":
            return request.max_tokens
        m = self._moments(request.task)
        if m is None:
            return max(1, round(self.prior))
        return max(1, round(rng.gauss(m.mean, m.std)))
