# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``sa``: the SLO-aware scheduler with simulated annealing (SA).

- Instance assignment (SA §4.4): round robin, each request to the instance with the largest
  *remaining memory*, estimated as tokens (Eq. 20) and charged with the request's prompt and
  predicted output. When even the largest cannot hold the request, every instance's remaining
  memory is reset to its current free KV (a fresh round).
- Per instance, the pending requests are ordered and batched by the annealing search of
  hfx/policies/sa_search.py (objective: attainment / mean latency). The search reruns whenever
  the pending set changed, over the oldest ``window`` requests.
- Release: the first planned batch is handed to the instance once its previous batches' prefills
  are predicted done (SA §4.4: "a batch ... is scheduled for execution from this queue as
  soon as the corresponding LLM instance is prepared and available"); the engine then decodes
  everything with continuous batching, as the seed's vLLM did.
- Output length (SA §5.1): a draw from the task's Gaussian fitted to observed lengths.
- ``max_batch`` bounds a batch; the seed ran 1, 2 and 4 on V100s, we default to 16 for the
  larger NPU profile.
"""

from __future__ import annotations

import random
from typing import TypedDict

from hfx.policies.base import ClusterView, Decision, Dispatch, Policy
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.sa_search import ALPHA, ITERATIONS, T0, T_MIN, Job, Plan, anneal
from hfx.policies.shadow import Shadows
from hfx.request import Request, RequestRecord
from hfx.stepmodel.latency import StepTimeModel


class _Params(TypedDict):
    """anneal's search parameters."""

    t0: float
    t_min: float
    iterations: int
    alpha: float


class _Search:
    """A search drawn but not yet run: its inputs as of the call that drew it. It runs only
    once the instance has a free slot, since a full engine takes no batch; while the instance
    stays full, arrivals replace it unrun (in overload nearly every search was discarded so).
    Drawing its seed when it is made keeps the policy's random stream, and so every plan,
    what it was when each search ran at once."""

    __slots__ = ("batch", "ctx", "jobs", "model", "seed")

    def __init__(self, jobs: list[Job], model: StepTimeModel, seed: int, ctx: float,
                 batch: int) -> None:
        self.jobs, self.model, self.seed, self.ctx, self.batch = jobs, model, seed, ctx, batch

    def run(self, max_batch: int, params: _Params) -> Plan:
        return anneal(self.jobs, self.model, max_batch, self.seed, self.ctx, self.batch,
                      **params)


class SimulatedAnnealing(Policy):
    name = "sa"
    planner = "prefill-first"

    def __init__(self, max_batch: int = 16, window: int = 40, t0: float = T0,
                 t_min: float = T_MIN, iterations: int = ITERATIONS, alpha: float = ALPHA,
                 seed: int = 0, output_length: str = "history") -> None:
        if max_batch < 1 or window < 1:
            raise ValueError("max_batch and window must be >= 1")
        if not (0 < alpha < 1 and t0 > 0 and t_min > 0 and iterations >= 1):
            raise ValueError("need t0 > 0, t_min > 0, iterations >= 1 and 0 < alpha < 1")
        self.max_batch, self.window = int(max_batch), int(window)
        self.params: _Params = {"t0": t0, "t_min": t_min, "iterations": int(iterations),
                                "alpha": alpha}
        self.rng = random.Random(int(seed))
        self.predictor = OutputLengthPredictor(output_length)
        self._arrived: list[Request] = []
        self._pending: dict[int, list[tuple[Request, float]]] = {}  # with sampled output
        self._plans: dict[int, Plan | _Search | None] = {}
        self._remaining: dict[int, float] = {}
        self._prefill_free_at: dict[int, float] = {}
        self.shadow = Shadows()

    def enqueue(self, request: Request, now: float) -> None:
        self._arrived.append(request)

    def num_queued(self) -> int:
        return len(self._arrived) + sum(len(p) for p in self._pending.values())

    def withdraw(self, request_id: str) -> bool:
        for i, req in enumerate(self._arrived):
            if req.id == request_id:
                del self._arrived[i]
                return True
        for iid, pending in self._pending.items():
            for i, (req, _) in enumerate(pending):
                if req.id == request_id:
                    del pending[i]
                    self._plans[iid] = None  # the plan indexes the pending list: search again
                    return True
        return False

    def _assign(self, req: Request, out_len: float, view: ClusterView) -> int:
        """Largest remaining memory first; reset the round when it cannot hold the request."""
        need = req.prompt_len + out_len
        iid = max(self._remaining, key=lambda i: (self._remaining[i], -i))
        if self._remaining[iid] < need:
            for i in self._remaining:
                self._remaining[i] = max(0.0, self.shadow[i].free_kv_tokens())
            iid = max(self._remaining, key=lambda i: (self._remaining[i], -i))
        self._remaining[iid] -= need
        return iid

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        now, model = view.now, view.step_model
        targets = view.accepting()
        if not targets:
            return decision
        if self.shadow.follow(view, targets):  # snapshots or membership moved: O(N) then only
            for inst in targets:
                sh = self.shadow[inst.id]
                self._prefill_free_at.setdefault(inst.id, now)
                if inst.id not in self._pending:
                    self._pending[inst.id], self._plans[inst.id] = [], None
                    self._remaining[inst.id] = float(sh.kv_capacity_tokens)
        for req in self._arrived:
            out_len = float(self.predictor.sample(req, self.rng))
            iid = self._assign(req, out_len, view)
            self._pending[iid].append((req, out_len))
            self._plans[iid] = None  # the pending set changed: search again
        self._arrived.clear()

        wake = None
        for inst in targets:
            iid, pending, sh = inst.id, self._pending[inst.id], self.shadow[inst.id]
            if not pending:
                continue
            if self._prefill_free_at[iid] > now:
                wake = min(wake or float("inf"), self._prefill_free_at[iid])
                continue
            planned = self._plans[iid]
            if planned is None:
                head = pending[:self.window]
                jobs = []
                for r, o in head:
                    assert r.slo is not None
                    jobs.append(Job(r.prompt_len, o, now - r.arrival, r.slo.ttft, r.slo.tpot))
                planned = self._plans[iid] = _Search(jobs, model, self.rng.getrandbits(32),
                                                      sh.decode_ctx, sh.batch_size)
            free = sh.free_slots()
            if free <= 0:
                continue  # the engine is full: a finished request will call us again
            if isinstance(planned, _Search):
                planned = self._plans[iid] = planned.run(self.max_batch, self.params)
            plan = planned
            size = min(plan.sizes[0], free)
            if size <= 0:
                continue
            chosen = plan.order[:size]
            batch = [pending[j] for j in chosen]
            # The plan indexes the head (the first ``window``): delete there, in place, rather
            # than copy a backlog that grows in overload.
            for j in sorted(chosen, reverse=True):
                del pending[j]
            self._plans[iid] = None
            s_len = s_sq = 0
            for req, out_len in batch:
                decision.dispatch.append(Dispatch(req, iid))
                sh.add(req, out_len)
                s_len += req.prompt_len
                s_sq += req.prompt_len ** 2
            self._prefill_free_at[iid] = now + model.prefill_time(s_len, s_sq)
            if self._pending[iid]:
                wake = min(wake or float("inf"), self._prefill_free_at[iid])
        decision.wake_at = wake
        return decision

    def on_instance_removed(self, instance_id: int) -> None:
        self._arrived.extend(r for r, _ in self._pending.pop(instance_id, []))
        self._plans.pop(instance_id, None)
        self._remaining.pop(instance_id, None)

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        self.shadow.finished(record, record.instance, self.predictor)
