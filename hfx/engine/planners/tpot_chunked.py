# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""PolyServe's continuous batching with dynamic chunking (PolyServe §4.5, §4.7).

Every running sequence decodes each step. The prefill token budget is what keeps the step within
the tightest TPOT of the running sequences (``time2bs``; the configured budget when none decodes).
Dynamic chunking: a prompt whose remaining tokens are fewer than twice the budget runs to the end
in this step, and no other prompt is admitted beside it — one iteration fewer for almost every
request, at the price of one longer step.
"""

from __future__ import annotations

from collections.abc import Iterator

from hfx.engine.cohort import DecodeCohort
from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput
from hfx.engine.planners.pacing import time2bs
from hfx.engine.sequence import RequestStatus, Sequence


class TPOTChunkedPlanner(BatchPlanner):
    name = "tpot-chunked"
    default_token_budget = 2048
    needs_model = True
    plans_cohort = True
    mixes_decodes = True

    def _budget(self, t0: float | None, ctx: int, num_decode: int) -> int:
        """The step's prefill tokens: what keeps it within the tightest decoding TPOT ``t0``."""
        if t0 is None:
            return self.token_budget
        assert self.model is not None  # needs_model
        return max(1, time2bs(self.model, t0, ctx, num_decode))

    def plan(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        running, cohort = state.running, state.cohort
        if cohort is None:
            started, budget = self._plan_decodes(state, out)
        else:
            # Every decoding sequence is a member; the rest of the running list is prompts
            # under way (usually none: a prompt done in one step has joined).
            started = self._prompts_under_way(running, cohort)
            budget = self._budget(cohort.min_tpot(), cohort.decode_ctx, len(cohort))
            self.decode_cohort(state, cohort, out)
        if out.preempted:  # a preempted prompt went back to the waiting queue
            started = [s for s in started if s.status is RequestStatus.RUNNING]
        self._plan_prompts(state, out, started, budget)
        return out

    @staticmethod
    def _prompts_under_way(running: list[Sequence], cohort: DecodeCohort) -> list[Sequence]:
        """The running sequences that are not members, in order. One recomputed after a
        preemption down to its last token (a chunk of exactly its rest but one) decodes from
        here, as a per-sequence plan would count it: it joins first."""
        if len(running) == len(cohort):
            return []
        started = []
        for s in running:
            if s.in_cohort:
                continue
            if s.num_computed_tokens == s.num_tokens - 1 and s.output_token_ids:
                cohort.join(s)  # Sequence.is_decode
            else:
                started.append(s)
        return started

    def _plan_decodes(self, state: EngineState,
                      out: SchedulerOutput) -> tuple[list[Sequence], int]:
        """Without a cohort: every decoding sequence, one by one. Returns the prompts under
        way and the step's prefill budget."""
        running, kv = state.running, state.kv
        decoding: list[Sequence] = []
        started: list[Sequence] = []
        ctx = 0
        for s in running:
            n = s.num_tokens
            if s.num_computed_tokens == n - 1 and s.output_token_ids:  # Sequence.is_decode
                decoding.append(s)
                ctx += n
            else:
                started.append(s)
        t0 = min([s.tpot for s in decoding if s.tpot], default=None)  # a list: faster here
        budget = self._budget(t0, ctx, len(decoding))
        # Decodes first, every step (preempting the newest when KV runs out).
        block_size = kv.block_size
        scheduled = out.num_scheduled_tokens
        ctx = 0
        for seq in decoding:
            if out.preempted and seq.status is not RequestStatus.RUNNING:
                continue  # preempted for an earlier decode: it waits, and holds no KV
            n = seq.num_tokens
            if n > seq.num_blocks * block_size and \
                    not self.make_room(state, seq, n, out):
                continue  # seq itself was preempted (the newest): it waits
            scheduled[seq] = 1
            ctx += n
        out.shape.decode_ctx += ctx
        out.shape.num_decode += len(scheduled)
        return started, budget

    def _plan_prompts(self, state: EngineState, out: SchedulerOutput, started: list[Sequence],
                      budget: int) -> None:
        """Prompts: those already started, then new ones, in order."""
        running, kv = state.running, state.kv
        for seq in _prompts(started, state):
            if budget <= 0:
                break
            cached = kv.cached_prefix(seq)  # 0 for one under way
            remaining = seq.num_missing - cached
            whole = self.runs_whole(seq, remaining, budget, state)
            n = remaining if whole else budget
            if seq.status is RequestStatus.WAITING and len(running) >= \
                    self.config.max_num_seqs:
                break
            if not kv.allocate(seq, seq.num_computed_tokens + cached + n, 0, cached):
                break
            self.admit(state, seq)
            out.schedule(seq, n)
            if whole and n >= budget:
                break  # the step is full: no other prompt beside an oversized final chunk
            budget -= n

    def runs_whole(self, seq: Sequence, remaining: int, budget: int,
                   state: EngineState) -> bool:
        """Whether the ``remaining`` tokens of ``seq``'s prompt (past what is cached) run in
        this step: dynamic chunking (PolyServe §4.7), the rest is fewer than two budgets."""
        return remaining < 2 * budget


def _prompts(started: list[Sequence], state: EngineState) -> Iterator[Sequence]:
    """Prompts in order: those already started, then the waiting queue from its head — one at
    a time, since the caller admits each or stops (a copy of the queue per step grew with the
    backlog)."""
    yield from started
    waiting = state.waiting
    while waiting:
        seq = waiting[0]
        yield seq
        if waiting and waiting[0] is seq:
            return  # not admitted: the caller has stopped
