# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Chunked-prefill planning (Sarathi-Serve; vLLM v1's default).

Each step has a token budget. Running sequences go first in admission order: a decode takes one
token, a partly computed prompt takes a chunk of what is left. Waiting sequences are then admitted
FCFS with chunks of the remaining budget, unless this step had to preempt (as vLLM v1 does).
"""

from __future__ import annotations

from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput


class ChunkedPlanner(BatchPlanner):
    name = "chunked"
    default_token_budget = 2048
    mixes_decodes = True
    splits_prompts = True

    def plan(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
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
