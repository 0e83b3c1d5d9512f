# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""HFX's engine (ours): PolyServe's TPOT-aware chunked prefill (PolyServe §4.5, §4.7)
that does not let chunking cost a prompt its TTFT.

TPOT-paced chunks keep every step within the tightest running TPOT, so a long prompt beside a
busy batch takes many steps: 8k tokens at ~250 a step beside a 20 ms batch are 32 steps, 0.65 s,
and a 0.3 s TTFT that the prompt's prefill alone (0.27 s) would keep is lost. Here, when the rest
of a prompt at this step's budget would not be done early enough before its TTFT deadline
(``slack_share``) and the rest in one step would still keep it, it runs whole now: one longer
step, which the running requests' mean TPOT (Eq. 4) spreads over their outputs. A prompt past
saving keeps the paced chunks: stalling every decode for it would buy nothing.

Waiting prompts start earliest TTFT deadline first, those already past it last
(``DeadlineWaitingQueue``; PolyServe §4.2's bins are EDF). First come first served, a dispatcher
that places every request at once (round robin, least-loaded) put wikisql's long prompts ahead
of every tight task's short ones, and steps paced to a 0.5 s TPOT carried them: round robin on
four-task at 120 QPS (2 instances, 1,024 sequences, seed 0) attained 0.392 FCFS, 0.917 EDF with
the late last, 0.917 EDF alone (0.428 and 0.365 at 150 QPS); least-loaded on two-task at 120
QPS 0.686, 0.896 and 0.811. HFX's own dispatcher sends about what the next steps take, and
moved by at most 0.5 points (four-task, two-task, bursty-four-task at their knees;
docs/log/2026-11-29-engine-probes.md).

``prefill_alone`` (ours; 0, off, by default): while fewer than this share of ``max_num_seqs``
run, and every decoding request is far enough ahead of its TPOT schedule to sit out one step, a
step with prompts to start prefills them alone (the prefill-first engine's step) instead of
beside every decode. A request that has sampled k tokens in e seconds since its first may wait
k·TPOT − e before its next token misses its schedule; mean TPOT (HyperFlexis Eq. 4) and
per-token deadlines (PolyServe) both count from the first token, so a step it sits out within
that costs it nothing. With a large running batch (1,024 sequences) a mixed step carries
hundreds of decodes, and a prompt's first token waits for them: four-task at 160 QPS, seeds 0-2,
attained 0.869 mixed and 0.929 with prefill-alone steps (docs/data/prefill_alone/). Where
sequence slots bind (256), pausing decodes holds slots longer (0.953 → 0.911 at 125 QPS): the
share keeps these steps to a batch with room. Tuned on six-task under the comparison protocol it
stays off (docs/results.md, "The comparison in detail").
"""

from __future__ import annotations

from collections.abc import Callable

from hfx.engine.planners.base import EngineState, SchedulerOutput
from hfx.engine.planners.pacing import runs_whole
from hfx.engine.planners.prefill_first import PrefillFirstPlanner, prefill_whole
from hfx.engine.planners.tpot_chunked import TPOTChunkedPlanner
from hfx.engine.sequence import Sequence
from hfx.engine.waiting import DeadlineWaitingQueue, WaitingQueue

# A prefill-alone step's token budget: the prefill-first engine's.
PREFILL_ALONE_TOKENS = PrefillFirstPlanner.default_token_budget


class DeadlineChunkedPlanner(TPOTChunkedPlanner):
    name = "deadline-chunked"
    # Paced chunks must be done within this share of the time left to the TTFT deadline: the
    # rest absorbs step-time noise and the steps spent behind other prompts. HFX on
    # tiered-4096-1024 at 4.5 QPS (300 s steady state, seeds 0-2) attains 0.83, 0.87, 0.88 and
    # 0.88 with 1.0, 0.7, 0.4 and 0.25.
    slack_share = 0.4
    prefill_alone = 0.0
    tunables = ("slack_share", "prefill_alone")

    def make_waiting(self, blocks_for: Callable[[int], int]) -> WaitingQueue:
        return DeadlineWaitingQueue(blocks_for)

    def plan(self, state: EngineState) -> SchedulerOutput:
        state.waiting.settle(state.now)  # prompts past their TTFT deadline go last
        if self.prefill_alone and state.waiting and \
                len(state.running) < self.prefill_alone * self.config.max_num_seqs and \
                self._decodes_can_wait(state):
            out = SchedulerOutput()
            self._plan_prefill_alone(state, out)
            if out:
                return out
        return super().plan(state)

    def _decodes_can_wait(self, state: EngineState) -> bool:
        """Whether every decoding request is ahead of its TPOT schedule by at least the
        prefill-alone step the waiting prompts would take."""
        assert self.model is not None
        tokens = square = 0
        for seq in state.waiting:
            n = seq.num_missing
            if tokens and tokens + n > PREFILL_ALONE_TOKENS:
                break
            tokens += n
            square += n * n
        step = self.model.prefill_time(tokens, square)
        now = state.now
        if state.cohort is not None:
            state.cohort.sync_all()  # reads each decode's output count
        for s in state.running:
            tpot = s.tpot
            if not tpot or not s.is_decode:
                continue
            first = s.first_decode_at
            if first is None:
                s.first_decode_at = first = now
            # Sitting this step out, its next token comes a step late: ahead by k·TPOT − e.
            if len(s.output_token_ids) * tpot - (now - first) < step:
                return False
        return True

    def _plan_prefill_alone(self, state: EngineState, out: SchedulerOutput) -> None:
        prefill_whole(state, out, PREFILL_ALONE_TOKENS, self.config.max_num_seqs,
                      self.config.watermark_blocks)

    def runs_whole(self, seq: Sequence, remaining: int, budget: int,
                   state: EngineState) -> bool:
        if remaining < 2 * budget or seq.prefill_deadline is None:
            return remaining < 2 * budget
        # A paced step lasts about the tightest running TPOT (what set the budget); with
        # nothing decoding, the budget's prefill.
        if state.cohort is not None:  # the cohort is every decode
            t0 = state.cohort.min_tpot()
        else:
            t0 = min((s.tpot for s in state.running if s.is_decode and s.tpot), default=None)
        assert self.model is not None
        return runs_whole(self.model, remaining, budget, t0, seq.prefill_deadline - state.now,
                          self.slack_share)
