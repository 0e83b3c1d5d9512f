# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The batch-planner interface: one ``plan()`` per engine step.

A planner decides which sequences compute how many tokens in the next step ({sequence: tokens},
as vLLM v1's scheduler output), admits waiting sequences (allocating their KV), and preempts by
recompute when KV runs out: the victim's blocks are freed, its computed count drops to 0, and it
goes back to the front of the waiting queue with the tokens it already generated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from hfx.engine.block_manager import BlockManager
from hfx.engine.cohort import DecodeCohort
from hfx.engine.config import EngineConfig
from hfx.engine.sequence import RequestStatus, Sequence
from hfx.engine.waiting import WaitingQueue
from hfx.stepmodel.step_time import BatchShape, StepTimeModel


@dataclass(slots=True)
class EngineState:
    """The queues a planner works on; owned by the engine core."""

    waiting: WaitingQueue
    running: list[Sequence]
    kv: BlockManager
    now: float = 0.0  # the loop's time when the step is planned (set by the engine core)
    # The decoding sequences, advanced by a counter (cohort.py), when the planner plans with
    # one and the engine runs it; else None and every sequence is stepped on its own.
    cohort: DecodeCohort | None = None
    next_order: int = 0  # the next running-list position (Sequence.order)

    def run(self, seq: Sequence) -> None:
        """Append ``seq`` to the running list."""
        seq.status = RequestStatus.RUNNING
        seq.order = self.next_order
        self.next_order += 1
        self.running.append(seq)


@dataclass(slots=True, init=False)
class SchedulerOutput:
    num_scheduled_tokens: dict[Sequence, int]
    shape: BatchShape
    preempted: list[Sequence]
    # Set when every member of this cohort decodes one token in the step, beside (not in)
    # ``num_scheduled_tokens``; the step's shape counts them.
    cohort: DecodeCohort | None

    # Written out, not generated: mypyc compiles it (as hfx.request.Request's).
    def __init__(self, num_scheduled_tokens: dict[Sequence, int] | None = None,
                 shape: BatchShape | None = None, preempted: list[Sequence] | None = None,
                 cohort: DecodeCohort | None = None) -> None:
        self.num_scheduled_tokens = {} if num_scheduled_tokens is None else num_scheduled_tokens
        self.shape = BatchShape() if shape is None else shape
        self.preempted = [] if preempted is None else preempted
        self.cohort = cohort

    def schedule(self, seq: Sequence, num_tokens: int) -> None:
        self.num_scheduled_tokens[seq] = num_tokens
        if seq.is_decode:
            self.shape.add_decode(seq.num_tokens)
        else:
            self.shape.add_prefill(num_tokens, seq.num_computed_tokens)

    def __bool__(self) -> bool:
        return bool(self.num_scheduled_tokens) or self.cohort is not None

    def request_ids(self) -> list[str]:
        """Every request the step computes for, the cohort's members first."""
        members = self.cohort.in_running_order() if self.cohort is not None else []
        return [s.request_id for s in [*members, *self.num_scheduled_tokens]]


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

    def make_waiting(self, blocks_for: Callable[[int], int]) -> WaitingQueue:
        """The engine's waiting queue, in the order this planner serves it: FCFS."""
        return WaitingQueue(blocks_for)

    # Whether its decode steps take every decoding sequence, so that they can be planned as
    # one decode cohort (cohort.py).
    plans_cohort: ClassVar[bool] = False

    def takes_cohort(self) -> bool:
        """Whether the engine keeps a decode cohort for this planner: ``plans_cohort``, and for
        one that cuts each step at its token budget (``splits_prompts``), a budget that holds a
        decode of every running sequence (planners/chunked.py, ``plan_cohort_first``)."""
        return self.plans_cohort and (not self.splits_prompts
                                      or self.config.max_num_seqs <= self.token_budget)
    # Whether a step that prefills also decodes every running sequence (chunked prefill), so a
    # prompt's first token comes with a step that carries the running batch's decodes; a
    # dispatcher that predicts first tokens needs to know (hfx/policies/hfx.py). slo-paced
    # prefills beside the decodes that are due only, so it is not counted as one.
    mixes_decodes: ClassVar[bool] = False
    # Whether every step takes at most ``token_budget`` tokens, decodes first and prompts
    # chunked into the rest whatever their deadlines (vLLM's scheduler, ``chunked``): a long
    # prompt, or a queue of them, then spans several steps, which a dispatcher that predicts
    # first tokens needs to know (``ClusterView.step_tokens``).
    splits_prompts: ClassVar[bool] = False

    @classmethod
    def step_tokens(cls, config: EngineConfig) -> int | None:
        """The per-step token budget a dispatcher should predict with (``splits_prompts``),
        else None: prompts run whole or are paced by deadlines."""
        if not cls.splits_prompts:
            return None
        return config.max_num_batched_tokens or cls.default_token_budget

    @staticmethod
    def admit(state: EngineState, seq: Sequence) -> None:
        """Move a waiting sequence (whose KV was just allocated) to the running list."""
        if seq.status is RequestStatus.WAITING:
            state.waiting.remove(seq)
            state.run(seq)
            state.kv.note_admission(seq)

    def make_room(self, state: EngineState, seq: Sequence, num_tokens: int,
                  out: SchedulerOutput) -> bool:
        """Grow a running ``seq``'s KV to ``num_tokens``, preempting the most recently admitted
        running sequences (vLLM's victims) until it fits. False if ``seq`` itself was preempted:
        it was the newest, so nothing after it in ``state.running`` is left to plan."""
        while not state.kv.allocate(seq, num_tokens):
            victim = state.running.pop()
            self.preempt(state, victim, out)
            if victim is seq:
                return False
        return True

    def decode_cohort(self, state: EngineState, cohort: DecodeCohort,
                      out: SchedulerOutput) -> None:
        """Plan a decode step of every cohort member: the KV blocks of the members that cross
        into a new one at this step (one count while they fit; else in running-list order,
        preempting the newest running sequences when none is free, as a per-sequence pass
        would), then the step's shape. Nothing per member that crosses nothing."""
        tick = cohort.tick
        for seq in cohort.crossing():
            if not seq.in_cohort:
                continue  # preempted for a member before it in this step
            if self.make_room(state, seq, seq.cohort_base + tick, out):
                cohort.crossed(seq)
        if cohort:
            out.cohort = cohort
            out.shape.decode_ctx += cohort.decode_ctx
            out.shape.num_decode += len(cohort)

    @staticmethod
    def preempt(state: EngineState, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute preemption: free the KV, keep the generated tokens, requeue at the front."""
        if state.cohort is not None:
            state.cohort.discard(seq)
        state.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = RequestStatus.WAITING
        state.waiting.appendleft(seq)
        out.preempted.append(seq)
