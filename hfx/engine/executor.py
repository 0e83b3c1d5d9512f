"""Executors run a planned step. The engine core does not know which kind it holds.

``SimExecutor`` predicts the step's duration with a step-time model and waits it out on the
running loop's clock: on the virtual-time loop that is a simulation, on the ordinary loop it is
a model-speed stand-in for a real engine. A real executor (a model on CPU/GPU) implements the
same method and returns the sampled token ids.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from hfx.engine.planners.base import SchedulerOutput
from hfx.engine.sequence import PLACEHOLDER_TOKEN, Sequence
from hfx.engine.step_noise import StepNoise
from hfx.stepmodel.step_time import BatchShape, StepTimeModel

__all__ = ["PLACEHOLDER_TOKEN", "Executor", "SimExecutor", "StepNoise", "steps_are_waits"]


class Executor(Protocol):
    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int] | None:
        """Run one step; return {sequence: sampled token} for sequences that sample, or None
        when the executor produces no real tokens (the engine then emits placeholders)."""
        ...


class SimExecutor:
    # It needs the step's shape only, not its sequences: the engine core leaves the decode
    # cohort's members out of ``num_scheduled_tokens`` (cohort.py) and keeps no KV block ids.
    plans_by_shape = True
    # Its steps' times are known before they run: on a virtual clock the engine core may
    # advance several decode steps as one timer (EngineCore, decode runs).
    advances_runs = True

    def __init__(self, model: StepTimeModel, noise: StepNoise | None = None) -> None:
        self.model = model
        self.noise = noise

    @property
    def step_model(self) -> StepTimeModel:
        """The model its steps follow: the instance's, for planners that pace by time."""
        return self.model

    def duration(self, shape: BatchShape) -> tuple[float, float | None]:
        """A step's time, and the noise factor drawn for it (None: none drawn)."""
        t = self.model.step_time(shape)
        if self.noise is not None and t > 0:
            factor = self.noise.factor()
            return t * factor, factor
        return t, None

    def put_back(self, factors: list[float | None]) -> None:
        """The noise factors of steps planned and not run (a decode run cut short)."""
        if self.noise is not None:
            self.noise.put_back([f for f in factors if f is not None])

    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int] | None:
        await asyncio.sleep(self.duration(out.shape)[0])
        return None


def steps_are_waits(executor: object) -> bool:
    """Whether each step of ``executor`` is only a wait of its ``duration`` (a SimExecutor
    whose ``execute`` is neither overridden nor replaced, as a fault injector does): a driver
    may then time its steps with loop timers instead of awaiting ``execute`` (LocalInstance)."""
    return isinstance(executor, SimExecutor) and \
        getattr(executor.execute, "__func__", None) is SimExecutor.execute
