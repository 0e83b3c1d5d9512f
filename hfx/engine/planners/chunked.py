# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Chunked-prefill planning (Sarathi-Serve; vLLM v1's default).

Each step has a token budget. Running sequences go first in admission order: a decode takes one
token, a partly computed prompt takes a chunk of what is left. Waiting sequences are then admitted
FCFS with chunks of the remaining budget, unless this step had to preempt (as vLLM v1 does).

With a decode cohort (cohort.py), a step whose per-sequence plan would decode every decoding
sequence is planned as one cohort step (``plan_cohort_first``, shared with vLLM's planner).
"""

from __future__ import annotations

from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput


class ChunkedPlanner(BatchPlanner):
    name = "chunked"
    default_token_budget = 2048
    mixes_decodes = True
    splits_prompts = True
    plans_cohort = True

    def plan(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = plan_cohort_first(self, state, out) if state.cohort is not None else None
        if budget is None:
            budget = self._plan_running(state, out)
        if not out.preempted:
            self._plan_waiting(state, out, budget)
        return out

    def _plan_running(self, state: EngineState, out: SchedulerOutput) -> int:
        running, block_size = state.running, state.kv.block_size
        budget = self.token_budget
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.num_missing, budget)
            want = seq.num_computed_tokens + n
            # Most steps cross no block boundary: no KV call then.
            if want > seq.num_blocks * block_size and \
                    not self.make_room(state, seq, want, out):
                break  # seq itself was preempted, the last of the running list
            out.schedule(seq, n)
            budget -= n
            i += 1
        return budget

    def _plan_waiting(self, state: EngineState, out: SchedulerOutput, budget: int) -> None:
        waiting, running, kv = state.waiting, state.running, state.kv
        reserve = self.config.watermark_blocks
        while waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            seq = waiting[0]
            cached = kv.cached_prefix(seq)
            n = min(seq.num_missing - cached, budget)
            if not kv.allocate(seq, seq.num_computed_tokens + cached + n,
                               reserve if running else 0, cached):
                break
            self.admit(state, seq)
            out.schedule(seq, n)
            budget -= n


def plan_cohort_first(planner: BatchPlanner, state: EngineState,
                      out: SchedulerOutput) -> int | None:
    """The running list of a budget-cut planner (chunked, vLLM's) as one cohort step: every
    member decodes, then the prompts under way take chunks of the budget left, which this
    returns. Only where the per-sequence pass would plan exactly that, one token for every
    member first: the members come first in the running list (a prompt under way was admitted
    after them) and the KV holds their crossings and the prompts' chunks, so nobody is
    preempted (each planner chooses its victims its own way, and vLLM's stops planning at
    one). Else every member leaves the cohort and None is returned: the caller plans the
    step one sequence at a time, and each joins again with its next token (core.py)."""
    cohort = state.cohort
    assert cohort is not None
    running, kv = state.running, state.kv
    members = len(cohort)
    budget = planner.token_budget - members
    block_size = kv.block_size
    need = 0
    left = budget
    for i in range(members, len(running)):
        seq = running[i]
        if seq.in_cohort:  # a member after a prompt under way
            cohort.clear()
            return None
        if left > 0:
            n = min(seq.num_missing, left)
            need += kv.blocks_needed(seq, seq.num_computed_tokens + n)
            left -= n
    if cohort.ticks_with_blocks(1, kv.num_free_blocks - need) < 1:
        cohort.clear()  # somebody is preempted: the planner's own pass chooses whom
        return None
    planner.decode_cohort(state, cohort, out)
    for i in range(members, len(running)):
        if budget <= 0:
            break
        seq = running[i]
        n = min(seq.num_missing, budget)
        want = seq.num_computed_tokens + n
        # As the per-sequence pass: a KV call only across a block boundary (it fits).
        if want > seq.num_blocks * block_size:
            kv.allocate(seq, want)
        out.schedule(seq, n)
        budget -= n
    return budget
