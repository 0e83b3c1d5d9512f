"""PolyServe's continuous batching with dynamic chunking (seed 003 §4.5, §4.7).

Every running sequence decodes each step. The prefill token budget is what keeps the step within
the tightest TPOT of the running sequences (``time2bs``; the configured budget when none decodes).
Dynamic chunking: a prompt whose remaining tokens are fewer than twice the budget runs to the end
in this step, and no other prompt is admitted beside it — one iteration fewer for almost every
request, at the price of one longer step.
"""

from __future__ import annotations

from collections.abc import Iterator

from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput
from hfx.engine.planners.slo_paced import time2bs
from hfx.engine.sequence import RequestStatus, Sequence


class TPOTChunkedPlanner(BatchPlanner):
    name = "tpot-chunked"
    default_token_budget = 2048
    needs_model = True

    def budget(self, state: EngineState) -> int:
        decoding = [s for s in state.running if s.is_decode]
        t0 = min((s.tpot for s in decoding if s.tpot), default=None)
        if t0 is None:
            return self.token_budget
        ctx = sum(s.num_tokens for s in decoding)
        return max(1, time2bs(self.model, t0, ctx, len(decoding)))

    def plan(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.budget(state)
        kv = state.kv
        # Decodes first, every step (preempting the newest when KV runs out).
        for seq in [s for s in state.running if s.is_decode]:
            while kv.allocate(seq, seq.num_tokens) is None:
                victim = state.running.pop()
                self.preempt(state, victim, out)
                if victim is seq:
                    break
            else:
                out.schedule(seq, 1)
        # Then prompts: those already started, then new ones, in order.
        for seq in _prompts(state):
            if budget <= 0:
                break
            remaining = seq.num_missing
            whole = self.runs_whole(seq, budget, state)
            n = remaining if whole else budget
            if seq.status is RequestStatus.WAITING and len(state.running) >= \
                    self.config.max_num_seqs:
                break
            if kv.allocate(seq, seq.num_computed_tokens + n) is None:
                break
            self.admit(state, seq)
            out.schedule(seq, n)
            if whole and n >= budget:
                break  # the step is full: no other prompt beside an oversized final chunk
            budget -= n
        return out

    def runs_whole(self, seq: Sequence, budget: int, state: EngineState) -> bool:
        """Whether the rest of ``seq``'s prompt runs in this step: dynamic chunking (seed 003
        §4.7), the rest is fewer than two budgets."""
        return seq.num_missing < 2 * budget


def _prompts(state: EngineState) -> Iterator[Sequence]:
    """Prompts in order: those already started, then the waiting queue from its head — one at
    a time, since the caller admits each or stops (a copy of the queue per step grew with the
    backlog, issue 18)."""
    yield from [s for s in state.running if not s.is_decode]
    waiting = state.waiting
    while waiting:
        seq = waiting[0]
        yield seq
        if waiting and waiting[0] is seq:
            return  # not admitted: the caller has stopped
