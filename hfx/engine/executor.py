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
from hfx.engine.sequence import Sequence
from hfx.latency import StepTimeModel

PLACEHOLDER_TOKEN = 0


class Executor(Protocol):
    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int] | None:
        """Run one step; return {sequence: sampled token} for sequences that sample, or None
        when the executor produces no real tokens (the engine then emits placeholders)."""
        ...


class SimExecutor:
    def __init__(self, model: StepTimeModel) -> None:
        self.model = model

    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int] | None:
        await asyncio.sleep(self.model.step_time(out.shape))
        return None
