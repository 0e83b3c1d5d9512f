# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Prefill-first planning (vLLM v0 and vLLM-Ascend's default, the seeds' engine).

When waiting requests can be admitted, the step is prefill-only: FCFS from the waiting queue
while the token budget, ``max_num_seqs`` and KV allow; decodes pause for that step. Otherwise
every running sequence decodes one token; when a decode needs a block and none is free, the most
recently admitted running sequence is preempted (recompute).
"""

from __future__ import annotations

from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput


class PrefillFirstPlanner(BatchPlanner):
    name = "prefill-first"
    default_token_budget = 8192
    plans_cohort = True

    def plan(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        if state.waiting:
            self._plan_prefill(state, out)
            if out:
                return out
        self._plan_decode(state, out)
        return out

    def _plan_prefill(self, state: EngineState, out: SchedulerOutput) -> None:
        prefill_whole(state, out, self.token_budget, self.config.max_num_seqs,
                      self.config.watermark_blocks)

    def _plan_decode(self, state: EngineState, out: SchedulerOutput) -> None:
        # The hot path of a simulation: every running sequence decodes one token. A decode
        # writes the KV of its last sampled token, so it needs room for num_tokens.
        if state.cohort is not None:  # every running sequence is a member
            self.decode_cohort(state, state.cohort, out)
            return
        running, block_size = state.running, state.kv.block_size
        scheduled = out.num_scheduled_tokens
        ctx = 0
        i = 0
        while i < len(running):
            seq = running[i]
            n = seq.num_tokens
            if n > seq.num_blocks * block_size and \
                    not self.make_room(state, seq, n, out):
                break  # seq itself was preempted, the last of the running list
            scheduled[seq] = 1
            ctx += n
            i += 1
        out.shape.decode_ctx += ctx
        out.shape.num_decode += len(scheduled)


def prefill_whole(state: EngineState, out: SchedulerOutput, budget: int, max_num_seqs: int,
                  reserve: int) -> None:
    """Whole prompts FCFS from the waiting queue while ``budget`` tokens, the sequence slots and
    the KV allow (a prefill-only step)."""
    waiting, running, kv = state.waiting, state.running, state.kv
    while waiting and len(running) < max_num_seqs:
        seq = waiting[0]
        cached = kv.cached_prefix(seq)
        n = seq.num_missing - cached
        # A prompt longer than the budget still runs, alone, rather than never.
        if n > budget and out:
            break
        if not kv.allocate(seq, seq.num_tokens, reserve if running else 0, cached):
            break  # FCFS: the head waits for KV, nobody overtakes it
        BatchPlanner.admit(state, seq)
        out.schedule(seq, n)
        budget -= n
