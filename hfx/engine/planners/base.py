"""The batch-planner interface: one ``plan()`` per engine step.

A planner decides which sequences compute how many tokens in the next step ({sequence: tokens},
as vLLM v1's scheduler output), admits waiting sequences (allocating their KV), and preempts by
recompute when KV runs out: the victim's blocks are freed, its computed count drops to 0, and it
goes back to the front of the waiting queue with the tokens it already generated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from hfx.engine.block_manager import BlockManager
from hfx.engine.config import EngineConfig
from hfx.engine.sequence import RequestStatus, Sequence
from hfx.engine.waiting import WaitingQueue
from hfx.stepmodel.latency import BatchShape, StepTimeModel


@dataclass(slots=True)
class EngineState:
    """The queues a planner works on; owned by the engine core."""

    waiting: WaitingQueue
    running: list[Sequence]
    kv: BlockManager
    now: float = 0.0  # the loop's time when the step is planned (set by the engine core)


@dataclass(slots=True)
class SchedulerOutput:
    num_scheduled_tokens: dict[Sequence, int] = field(default_factory=dict)
    shape: BatchShape = field(default_factory=BatchShape)
    preempted: list[Sequence] = field(default_factory=list)

    def schedule(self, seq: Sequence, num_tokens: int) -> None:
        self.num_scheduled_tokens[seq] = num_tokens
        if seq.is_decode:
            self.shape.add_decode(seq.num_tokens)
        else:
            self.shape.add_prefill(num_tokens, seq.num_computed_tokens)

    def __bool__(self) -> bool:
        return bool(self.num_scheduled_tokens)


class BatchPlanner(ABC):
    name: ClassVar[str]
    default_token_budget: ClassVar[int]
    needs_model: ClassVar[bool] = False
    # Class attributes a config may set per engine (``EngineConfig.planner_params``): the knobs
    # a fair comparison tunes.
    tunables: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: EngineConfig, model: StepTimeModel | None = None) -> None:
        self.config = config
        self.model = model  # the instance's step-time model, for planners that pace by time
        self.token_budget = config.max_num_batched_tokens or self.default_token_budget
        for key, value in config.planner_params.items():
            if key not in self.tunables:
                known = ", ".join(self.tunables) or "none"
                raise ValueError(f"planner {self.name!r} has no parameter {key!r} "
                                 f"(its parameters: {known})")
            setattr(self, key, float(value))

    @abstractmethod
    def plan(self, state: EngineState) -> SchedulerOutput: ...

    @staticmethod
    def admit(state: EngineState, seq: Sequence) -> None:
        """Move a waiting sequence (whose KV was just allocated) to the running list."""
        if seq.status is RequestStatus.WAITING:
            state.waiting.remove(seq)
            seq.status = RequestStatus.RUNNING
            state.running.append(seq)

    def make_room(self, state: EngineState, seq: Sequence, num_tokens: int,
                  out: SchedulerOutput) -> bool:
        """Grow a running ``seq``'s KV to ``num_tokens``, preempting the most recently admitted
        running sequences (vLLM's victims) until it fits. False if ``seq`` itself was preempted:
        it was the newest, so nothing after it in ``state.running`` is left to plan."""
        while state.kv.allocate(seq, num_tokens) is None:
            victim = state.running.pop()
            self.preempt(state, victim, out)
            if victim is seq:
                return False
        return True

    @staticmethod
    def preempt(state: EngineState, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute preemption: free the KV, keep the generated tokens, requeue at the front."""
        state.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = RequestStatus.WAITING
        state.waiting.appendleft(seq)
        out.preempted.append(seq)
