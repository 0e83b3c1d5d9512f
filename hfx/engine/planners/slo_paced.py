# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""SLOs-Serve batch formation with dynamic batch size (SLOs-Serve §3.2.2, Algorithm 2; §4.1).

Each step lasts at most t0, the tightest TPOT among decoding SLO requests, and carries the largest
token batch the step-time model fits into t0 (``time2bs``). Decode tokens are allocated earliest
deadline first: a request's next token is due 0.9 TPOT after its previous one (``next_due``), and
a request is scheduled in this step if its token is due by the step's end. The rest of the
budget goes to prefill chunks, earliest prefill deadline first; what is still left decodes other
requests ahead of time (work conservation — without it requests paced at their SLO lived so long
that they filled every sequence slot and new prompts missed their TTFT). Best-effort requests
(§4.1) use whatever budget is left and are preempted first when KV runs out; preemption discards
KV and keeps generated tokens (recompute).
"""

from __future__ import annotations

from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput
from hfx.engine.planners.pacing import time2bs
from hfx.engine.sequence import RequestStatus, Sequence

# Decode tokens are due every pace × TPOT: paced exactly at the TPOT, every request sits on the
# edge of its SLO and any jitter misses it (ours; the seed gives no margin). A module constant,
# not only the class's: a compiled class's attribute is a descriptor when read from the class.
DEFAULT_PACE = 0.9


class SLOPacedPlanner(BatchPlanner):
    name = "slo-paced"
    default_token_budget = 2048  # per step when no SLO decode sets the pace
    needs_model = True
    pace = DEFAULT_PACE
    tunables = ("pace",)

    def plan(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        now = state.now
        # One pass over the running batch (this runs every step): its SLO decodes, the
        # tightest TPOT among them, and its SLO prefills.
        slo_decoding: list[Sequence] = []
        prefilling: list[Sequence] = []
        t0: float | None = None
        for s in state.running:
            if s.best_effort:
                continue
            if not s.is_decode:
                prefilling.append(s)
            elif s.tpot:
                slo_decoding.append(s)
                if t0 is None or s.tpot < t0:
                    t0 = s.tpot
        end = now + (t0 or 0.0)
        # 1. SLO decodes whose token is due by the end of this step, earliest due first.
        due = sorted((s for s in slo_decoding if s.next_due <= end), key=lambda s: s.next_due)
        ctx = 0
        for seq in due:
            if not self._room(state, seq, seq.num_tokens, out):
                continue
            out.schedule(seq, 1)
            ctx += seq.num_tokens
            assert seq.tpot is not None  # an SLO decode
            seq.next_due = max(seq.next_due, now) + self.pace * seq.tpot
        assert self.model is not None  # needs_model
        budget = (time2bs(self.model, t0, ctx, len(due)) if t0 is not None
                  else self.token_budget)
        # 2. SLO prefills, earliest prefill deadline first: running partial prompts, then waiting.
        # (Step 1 scheduled decodes only, and preempted only best-effort requests.)
        candidates = sorted(prefilling, key=_deadline) + sorted(
            (s for s in state.waiting if not s.best_effort), key=_deadline)
        budget = self._prefill(state, out, candidates, budget)
        # 3. Work conservation: budget left decodes SLO requests ahead of their due time,
        # earliest due first; their deadlines stay on schedule, so an early token banks slack.
        ahead = sorted((s for s in slo_decoding if s not in out.num_scheduled_tokens),
                       key=lambda s: s.next_due) if budget > 0 else []
        for seq in ahead:
            if budget <= 0:
                break
            if self._room(state, seq, seq.num_tokens, out):
                out.schedule(seq, 1)
                assert seq.tpot is not None  # an SLO decode
                seq.next_due += self.pace * seq.tpot
                budget -= 1
        # 4. Best effort, and requests with no TPOT target (nothing paces them): leftover
        # budget only.
        for seq in [s for s in state.running
                    if (s.best_effort or not s.tpot) and s.is_decode] if budget > 0 else []:
            if budget <= 0:
                break
            if self._room(state, seq, seq.num_tokens, out, best_effort=True):
                out.schedule(seq, 1)
                budget -= 1
        be = [s for s in state.running if s.best_effort and not s.is_decode
              and s not in out.num_scheduled_tokens]
        self._prefill(state, out, be + [s for s in state.waiting if s.best_effort], budget)
        if not out and slo_decoding:
            # Nothing is due and nothing else can run: decode the earliest now rather than idle
            # (an engine step never waits for the clock; early is never late).
            seq = min(slo_decoding, key=lambda s: s.next_due)
            if self._room(state, seq, seq.num_tokens, out):
                out.schedule(seq, 1)
                assert seq.tpot is not None  # an SLO decode
                seq.next_due = max(seq.next_due, now) + self.pace * seq.tpot
        return out

    def _prefill(self, state: EngineState, out: SchedulerOutput, seqs: list[Sequence],
                 budget: int) -> int:
        for seq in seqs:
            if budget <= 0 or (len(state.running) >= self.config.max_num_seqs and \
                    seq.status is RequestStatus.WAITING):
                break
            cached = state.kv.cached_prefix(seq)
            n = min(seq.num_missing - cached, budget)
            if not self._room(state, seq, seq.num_computed_tokens + cached + n, out,
                              seq.best_effort, cached):
                continue
            self.admit(state, seq)
            out.schedule(seq, n)
            budget -= n
        return budget

    def _room(self, state: EngineState, seq: Sequence, tokens: int, out: SchedulerOutput,
              best_effort: bool = False, cached: int = 0) -> bool:
        """Blocks for ``tokens`` of ``seq`` (``cached`` of them found in the prefix cache),
        preempting best-effort requests (newest first) for an SLO request; a best-effort
        request never preempts."""
        while not state.kv.allocate(seq, tokens, 0, cached):
            victims = [s for s in state.running if s.best_effort and s is not seq
                       and s not in out.num_scheduled_tokens]
            if best_effort or not victims:
                return False
            victim = victims[-1]
            state.running.remove(victim)
            self.preempt(state, victim, out)
        return True


def _deadline(seq: Sequence) -> float:
    return seq.prefill_deadline if seq.prefill_deadline is not None else float("inf")
