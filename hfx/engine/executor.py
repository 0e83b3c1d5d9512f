"""Executors run a planned step. The engine core does not know which kind it holds.

``SimExecutor`` predicts the step's duration with a step-time model and waits it out on the
running loop's clock: on the virtual-time loop that is a simulation, on the ordinary loop it is
a model-speed stand-in for a real engine. A real executor (a model on CPU/GPU) implements the
same method and returns the sampled token ids.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Protocol

from hfx.engine.planners.base import SchedulerOutput
from hfx.engine.sequence import PLACEHOLDER_TOKEN, Sequence
from hfx.stepmodel.latency import StepTimeModel

__all__ = ["PLACEHOLDER_TOKEN", "Executor", "SimExecutor", "StepNoise"]


class Executor(Protocol):
    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int] | None:
        """Run one step; return {sequence: sampled token} for sequences that sample, or None
        when the executor produces no real tokens (the engine then emits placeholders)."""
        ...


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

    def factor(self) -> float:
        return self._rng.lognormvariate(self._mu, self._sigma) if self.cv else 1.0


class SimExecutor:
    # It needs the step's shape only, not its sequences: the engine core leaves the decode
    # cohort's members out of ``num_scheduled_tokens`` (cohort.py).
    plans_by_shape = True

    def __init__(self, model: StepTimeModel, noise: StepNoise | None = None) -> None:
        self.model = model
        self.noise = noise

    @property
    def step_model(self) -> StepTimeModel:
        """The model its steps follow: the instance's, for planners that pace by time."""
        return self.model

    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int] | None:
        t = self.model.step_time(out.shape)
        if self.noise is not None and t > 0:
            t *= self.noise.factor()
        await asyncio.sleep(t)
        return None
