# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""A decode run: several steps of the decode cohort advanced as one timer.

When nothing can change an engine's plan for a while — nothing waits, no prompt is under way,
every running sequence decodes, and the KV for the stretch's block crossings is free — its next
steps are known: each is a decode of every cohort member, its shape two running sums, its time
the executor's model of that shape. The engine core (``EngineCore.step``) then takes the
stretch as one event: the step times drawn at once from the same noise stream in the same
order as stepping, one loop timer at the end. Anything that reads or changes the engine before
then first brings it to the loop's time exactly as stepping would have (``EngineCore``'s catch
up): the steps ended by then are applied, the one under way is planned, and a change ends the
run with that step. Only on a virtual clock, with an executor that predicts its steps
(``SimExecutor``): a real clock streams each token as it comes.

A run stops at the first member's last token (a finish changes the batch), at ``block_size``
steps (so each member crosses into at most one new block, all counted ahead), and before the
first crossing the free blocks cannot hold (which would preempt). Measured on the simulator's
settings (``bench/sim/engine_runs.py``): a quarter of the steps at 32 and 128 instances, half on
P/D decode instances, lie in stretches a run takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from hfx.engine.block_manager import BlockManager
from hfx.engine.cohort import DecodeCohort
from hfx.stepmodel.step_time import BatchShape


@dataclass(slots=True, init=False)
class DecodeRun:
    start: float  # when its first step was planned
    times: list[float]  # when each step ends
    factors: list[float | None]  # the noise factor drawn for each step
    length: int  # steps it takes; a cut shortens it to the step under way
    ended: Callable[[], None] | None  # what its timer calls (EngineCore.arm_run)
    timer: asyncio.TimerHandle | None
    applied: int  # steps whose tick is applied
    reported: int  # steps whose tick is in a StepOutput (EngineCore.flush_run)

    # Written out, not generated: mypyc compiles it (as hfx.request.Request's).
    def __init__(self, start: float, times: list[float], factors: list[float | None],
                 length: int, ended: Callable[[], None] | None = None,
                 timer: asyncio.TimerHandle | None = None, applied: int = 0,
                 reported: int = 0) -> None:
        self.start, self.times, self.factors, self.length = start, times, factors, length
        self.ended, self.timer, self.applied, self.reported = ended, timer, applied, reported


def plan_run(cohort: DecodeCohort, kv: BlockManager, executor: object, now: float
             ) -> tuple[list[float], list[float | None]] | None:
    """The end times and noise factors of the decode steps from now on that a run can take,
    or None when fewer than two can."""
    tick, n = cohort.tick, len(cohort)
    finish = cohort.next_finish()
    if finish is None:
        return None
    length = min(kv.block_size, finish - tick)
    if length < 2:
        return None
    # Plan ticks before the first crossing with no block left; it would preempt. And before
    # the first whose crossings are allocated one by one (cohort.next_listed).
    length = cohort.ticks_with_blocks(length, kv.num_free_blocks)
    listed = cohort.next_listed()
    if listed is not None:
        length = min(length, listed - tick)
    if length < 2:
        return None
    duration = executor.duration  # type: ignore[attr-defined]  # a SimExecutor's
    times: list[float] = []
    factors: list[float | None] = []
    base = cohort.decode_ctx
    t = now
    for i in range(length):
        step, factor = duration(BatchShape(decode_ctx=base + n * i, num_decode=n))
        t = t + step  # as the loop's clock adds a step's sleep
        times.append(t)
        factors.append(factor)
    return times, factors
