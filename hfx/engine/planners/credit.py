# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Credit-based decode batching (SCORPIO, arXiv 2505.23022, as HFX's HyperFlexis §7.4 runs it).

Prefills are planned as in prefill-first. For decodes, each running sequence earns a credit of
TRP = (tightest TPOT in the running set) / (its own TPOT) per step and decodes in a step once its
credit reaches 1, spending 1. The strictest requests decode every step; a request whose TPOT is
twice as loose decodes every other step, so a step carries fewer sequences and is faster. A
sequence with no TPOT target decodes every step.
"""

from __future__ import annotations

from hfx.engine.planners.base import EngineState, SchedulerOutput
from hfx.engine.planners.prefill_first import PrefillFirstPlanner


class CreditPlanner(PrefillFirstPlanner):
    name = "credit"
    plans_cohort = False  # a decode step takes the sequences whose credit is due

    def _plan_decode(self, state: EngineState, out: SchedulerOutput) -> None:
        running = state.running
        tightest = 0.0
        for seq in running:
            if seq.tpot and (not tightest or seq.tpot < tightest):
                tightest = seq.tpot
        chosen = []
        for seq in running:
            seq.credit += tightest / seq.tpot if (tightest and seq.tpot) else 1.0
            if seq.credit >= 1.0 - 1e-9:
                chosen.append(seq)
        if not chosen:
            return
        # Plan the chosen ones as prefill-first does (preempting if KV runs out), charge them,
        # and keep the running list in admission order, which decides preemption victims. One
        # pass each: this runs every step over the whole batch (issue 31).
        order = None if len(chosen) == len(running) else list(running)
        if order is not None:
            running[:] = chosen
        super()._plan_decode(state, out)
        for seq in out.num_scheduled_tokens:
            seq.credit -= 1.0
        if order is None:
            return  # all were due: the list is in order already, less any preempted
        if len(running) < len(chosen):  # some were preempted: they leave the admission order
            gone = set(chosen).difference(running)
            running[:] = [s for s in order if s not in gone]
        else:
            running[:] = order
