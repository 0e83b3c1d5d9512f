"""HFX's engine (ours): PolyServe's TPOT-aware chunked prefill (PolyServe §4.5, §4.7)
that does not let chunking cost a prompt its TTFT.

TPOT-paced chunks keep every step within the tightest running TPOT, so a long prompt beside a
busy batch takes many steps: 8k tokens at ~250 a step beside a 20 ms batch are 32 steps, 0.65 s,
and a 0.3 s TTFT that the prompt's prefill alone (0.27 s) would keep is lost. Here, when the rest
of a prompt at this step's budget would not be done early enough before its TTFT deadline
(``slack_share``) and the rest in one step would still keep it, it runs whole now: one longer
step, which the running requests' mean TPOT (Eq. 4) spreads over their outputs. A prompt past
saving keeps the paced chunks: stalling every decode for it would buy nothing.
"""

from __future__ import annotations

import math

from hfx.engine.planners.base import EngineState
from hfx.engine.planners.tpot_chunked import TPOTChunkedPlanner
from hfx.engine.sequence import Sequence


class DeadlineChunkedPlanner(TPOTChunkedPlanner):
    name = "deadline-chunked"
    # Paced chunks must be done within this share of the time left to the TTFT deadline: the
    # rest absorbs step-time noise and the steps spent behind other prompts. HFX on
    # tiered-4096-1024 at 4.5 QPS (300 s steady state, seeds 0-2) attains 0.83, 0.87, 0.88 and
    # 0.88 with 1.0, 0.7, 0.4 and 0.25.
    slack_share = 0.4
    tunables = ("slack_share",)

    def runs_whole(self, seq: Sequence, budget: int, state: EngineState) -> bool:
        remaining = seq.num_missing
        if remaining < 2 * budget or seq.prefill_deadline is None:
            return remaining < 2 * budget
        assert self.model is not None
        model = self.model
        # A paced step lasts about the tightest running TPOT (what set the budget); with
        # nothing decoding, the budget's prefill.
        t0 = min((s.tpot for s in state.running if s.is_decode and s.tpot), default=None)
        step = t0 if t0 is not None else model.prefill_one(budget)
        paced = math.ceil(remaining / max(budget, 1)) * step
        left = seq.prefill_deadline - state.now
        return paced > self.slack_share * left and left >= model.prefill_one(remaining)
