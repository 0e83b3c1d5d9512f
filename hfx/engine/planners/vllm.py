# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""vLLM v1's scheduler as ``hfx serve --engine vllm`` starts it: the simulator's, the
calibration's and the replay's model of a vLLM server (``Served.replay_planner``).

What ``Scheduler.schedule`` does in ``vllm/v1/core/sched/scheduler.py`` (vLLM 0.32) with the
flags HFX gives its servers (``--scheduling-policy priority``, prefix caching on, no speculative
decoding, no ``long_prefill_token_threshold``):

1. Running requests first, in the running list's order (admission order): each computes what it
   is missing (a decode one token, a prompt under way the rest of it) up to the step's token
   budget. When its KV does not fit, the running request of the lowest priority (the largest
   ``(priority, arrival)``) is preempted by recompute, even one already scheduled in this step
   (its tokens go back to the budget), until it fits or it is the victim itself; then no other
   running request is planned.
2. Waiting requests, only if nothing was preempted: by ``(priority, arrival)``
   (``request_queue.py``'s PriorityRequestQueue; a preempted request goes back by its own key,
   not to the front), while the budget lasts and fewer than ``max_num_seqs`` run. A request
   starts from its prefix-cache hit, and is admitted only if its whole prompt fits in the free
   KV (``scheduler_reserve_full_isl``, on by default), then with a chunk of the budget. The
   first that does not fit stops admission: nobody overtakes it.

The priority is the one HFX sends each request (``vllm_priority``): its TPOT SLO in
milliseconds, best-effort requests last. ``vllm-fcfs`` is vLLM's default policy (what a router
that sends no priority fronts): every request of one priority, so arrival order throughout and
the newest arrival preempted first. The simulator's ``chunked`` planner is that policy without
the whole-prompt check.
"""

from __future__ import annotations

from collections.abc import Callable

from hfx.engine.planners.base import BatchPlanner, EngineState, SchedulerOutput
from hfx.engine.planners.chunked import plan_cohort_first
from hfx.engine.sequence import Sequence
from hfx.engine.waiting import PriorityWaitingQueue, WaitingQueue

BEST_EFFORT_PRIORITY = 1 << 20  # below every SLO'd request in vLLM's priority order


def vllm_priority(tpot: float | None, best_effort: bool) -> int:
    """The priority HFX gives a request on a vLLM server (lower runs first, and is preempted
    last): HFX orders running requests by TPOT, tightest first (HyperFlexis §5.2's Q_R), and
    the TPOT SLO in milliseconds is that order. Best-effort requests go after every SLO'd one."""
    if best_effort or not tpot:
        return BEST_EFFORT_PRIORITY
    return max(0, round(tpot * 1e3))


class VLLMPlanner(BatchPlanner):
    name = "vllm"
    default_token_budget = 2048  # vLLM 0.32's max_num_batched_tokens for its server on CPU
    mixes_decodes = True
    splits_prompts = True
    # Share of the KV blocks a waiting request must leave free when others run: vLLM 0.32's
    # SchedulerConfig.watermark, 0 by default (the engine's ``watermark``, v0's 1%, is not
    # vLLM v1's and is not applied here).
    watermark = 0.0
    tunables = ("watermark",)
    # A step that preempts nobody decodes every running sequence first (``plan_cohort_first``).
    plans_cohort = True

    @staticmethod
    def priority(seq: Sequence) -> int:
        return vllm_priority(seq.tpot, seq.best_effort)

    def _victim_key(self, seq: Sequence) -> tuple[int, int]:
        """vLLM preempts the running request with the largest (priority, arrival_time)."""
        return self.priority(seq), seq.arrival

    def make_waiting(self, blocks_for: Callable[[int], int]) -> WaitingQueue:
        return PriorityWaitingQueue(blocks_for, self.priority)

    def plan(self, state: EngineState) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = plan_cohort_first(self, state, out) if state.cohort is not None else None
        if budget is None:
            scheduled: dict[Sequence, int] = {}
            budget = self._plan_running(state, out, scheduled)
            # Into the step's shape only now: a victim scheduled earlier in the step left it.
            for seq, n in scheduled.items():
                out.schedule(seq, n)
        if not out.preempted:
            self._plan_waiting(state, out, budget)
        return out

    def _plan_running(self, state: EngineState, out: SchedulerOutput,
                      scheduled: dict[Sequence, int]) -> int:
        running, kv = state.running, state.kv
        block_size = kv.block_size
        budget = self.token_budget
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.num_missing, budget)
            want = seq.num_computed_tokens + n
            # Most steps cross no block boundary: no KV call then.
            if want > seq.num_blocks * block_size:
                while not kv.allocate(seq, want):
                    victim = max(running, key=self._victim_key)
                    j = running.index(victim)
                    del running[j]
                    if j < i:  # scheduled already in this step: its tokens come back
                        i -= 1
                        budget += scheduled.pop(victim)
                    self.preempt(state, victim, out)
                    if victim is seq:
                        return budget  # vLLM stops planning the running list here
            scheduled[seq] = n
            budget -= n
            i += 1
        return budget

    def _plan_waiting(self, state: EngineState, out: SchedulerOutput, budget: int) -> None:
        waiting, running, kv = state.waiting, state.running, state.kv
        watermark = int(self.watermark * kv.num_blocks)
        while waiting and budget > 0 and len(running) < self.config.max_num_seqs:
            seq = waiting[0]
            cached = kv.cached_prefix(seq)
            n = min(seq.num_tokens - cached, budget)
            reserve = watermark if running else 0
            if not kv.fits(seq, seq.num_tokens, reserve, cached) or \
                    not kv.allocate(seq, cached + n, reserve, cached):
                break
            self.admit(state, seq)
            out.schedule(seq, n)
            budget -= n


class VLLMFCFSPlanner(VLLMPlanner):
    name = "vllm-fcfs"

    @staticmethod
    def priority(seq: Sequence) -> int:
        return 0  # vLLM's default request priority
