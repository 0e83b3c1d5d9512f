# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``scorpio``: SCORPIO (arXiv 2505.23022) extended with round robin across instances, as
HyperFlexis §7.4 runs it.

- Assignment: each arriving request goes round robin to an instance's waiting queue, kept in
  least-time-to-TTFT-deadline order (arrival + TTFT).
- TTFT guard: the TTFT estimate of the i-th waiting request is now plus the predicted prefill
  times of those before it and itself. A request whose estimate is past its deadline is rejected
  (counted as missed) — SCORPIO serves the right requests rather than all of them late.
- Admission, at each iteration boundary: walk the queue and admit w if the predicted TPOT with w
  joined stays within the tightest TPOT of the running set (w included). Predicted TPOT is
  ITL(n, L_avg) = α·n·L_avg + β·n + γ·L_avg + δ, evaluated as if the running requests keep going
  for w's predicted output length (their context grows by that much on average over w's life),
  with n the *virtual* batch size Σ TRP, and multiplied by a safety factor ε ≥ 1.
  (α, β, γ, δ) come from the dispatcher's step-time model, Eq. 2: α = b', β = c', γ = 0, δ = a'.
- Running requests are batched by credits inside the engine (planner ``credit``).
- Output length: the shared per-task mean (SCORPIO's classifier is not available here).
- Speed (ours): a decision re-walks only the queues that an event changed (an
  assignment, a finish, a Monitor snapshot) or whose guard's next rejection is due, so the
  per-task output means it reads are refreshed with each Monitor round, not on every finish.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from hfx.policies.base import ClusterView, Decision, Dispatch, Policy
from hfx.policies.deadline_queue import DeadlineQueue
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.shadow import ShadowInstance, Shadows
from hfx.request import Request, RequestRecord


@dataclass(slots=True)
class TPOTMix:
    """A running set's TPOT targets as SCORPIO reads them: the tightest and Σ 1/TPOT. The virtual
    batch size Σ TRP = tightest · Σ 1/TPOT with one more request is then O(1), not a pass over
    the batch for every queued request."""

    tightest: float = math.inf
    inverse_sum: float = 0.0

    @classmethod
    def of(cls, sh: ShadowInstance) -> TPOTMix:
        """The in-flight requests of an instance's shadow."""
        return cls(sh.min_tpot() or math.inf, sh.tpot_demand())

    def tightest_with(self, tpot: float) -> float:
        return min(self.tightest, tpot)

    def virtual_batch_with(self, tpot: float) -> float:
        """Σ TRP with TRP = tightest TPOT / own TPOT, one request of ``tpot`` joined."""
        return self.tightest_with(tpot) * (self.inverse_sum + 1.0 / tpot)

    def add(self, tpot: float) -> None:
        self.tightest = min(self.tightest, tpot)
        self.inverse_sum += 1.0 / tpot


class Scorpio(Policy):
    name = "scorpio"
    planner = "credit"

    def __init__(self, epsilon: float = 1.1, output_length: str = "history") -> None:
        if epsilon < 1.0:
            raise ValueError(f"the safety factor epsilon must be >= 1, got {epsilon}")
        self.epsilon = epsilon
        self.predictor = OutputLengthPredictor(output_length)
        # Per instance, the waiting requests in deadline order, each with its predicted prefill
        # (predicted once, at assignment, not on every walk of the queue).
        self._queues: dict[int, DeadlineQueue] = {}
        self._num_waiting = 0  # Σ len(queue): num_queued is asked on every call
        self._pending: list[Request] = []  # arrived, not yet assigned to an instance
        self._next = 0
        self._seq = 0
        self.shadow = Shadows()
        # A decision walks only the queues that may decide differently than last time (issue
        # 18): an instance is dirty after an assignment to it, a finish on it or a new Monitor
        # snapshot of it; a clean one is skipped until its guard's next rejection time.
        self._dirty: set[int] = set()
        self._reject_at: dict[int, float] = {}
        self._snapshot_at: dict[int, float] = {}
        # So that a call costs O(the queues it walks), not O(N): each accepting instance's place
        # in ``targets`` (the walk's order), and a heap of (rejection time, instance) with lazy
        # deletion (an entry is live while it is its instance's ``_reject_at`` and the instance
        # still queues work), both rebuilt when the view's version moves.
        self._place: dict[int, int] = {}
        self._rejections: list[tuple[float, int]] = []
        # Per-task output-length predictions, refreshed with each Monitor round rather than on
        # every finish anywhere (which would dirty every instance).
        self._out_len: dict[str, float] = {}

    def enqueue(self, request: Request, now: float) -> None:
        self._pending.append(request)

    def num_queued(self) -> int:
        return len(self._pending) + self._num_waiting

    def withdraw(self, request_id: str) -> bool:
        for i, req in enumerate(self._pending):
            if req.id == request_id:
                del self._pending[i]
                return True
        for queue in self._queues.values():
            if queue.withdraw(request_id):
                self._num_waiting -= 1
                return True
        return False

    def predicted_tpot(self, sh: ShadowInstance, mix: TPOTMix, req: Request,
                       out_len: float, alpha: float, beta: float, delta: float) -> float:
        """ε·ITL(n, L_avg) with req joined, over req's predicted life."""
        n_real = sh.batch_size + 1
        # Each running request's context grows by out_len/2 on average over req's life.
        ctx = sh.decode_ctx + req.prompt_len + n_real * out_len / 2
        l_avg = ctx / n_real
        assert req.slo is not None
        n = mix.virtual_batch_with(req.slo.tpot)
        return self.epsilon * (alpha * n * l_avg + beta * n + delta)

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        now, model = view.now, view.step_model
        targets = view.accepting()
        if not targets:
            return decision
        if self.shadow.follow(view, targets):  # snapshots or membership moved: O(N) only then
            self._place = {inst.id: k for k, inst in enumerate(targets)}
            for inst in targets:
                self._queues.setdefault(inst.id, DeadlineQueue())
                if self._snapshot_at.get(inst.id) != inst.stats.time:
                    self._snapshot_at[inst.id] = inst.stats.time
                    self._dirty.add(inst.id)
                    self._out_len.clear()
            self._rejections = [(at, iid) for iid, at in self._reject_at.items()
                                if iid in self._place and at < math.inf]
            heapq.heapify(self._rejections)
        for req in self._pending:  # round robin at arrival
            assert req.slo is not None
            iid = targets[self._next % len(targets)].id
            self._dirty.add(iid)
            self._next += 1
            self._seq += 1
            self._queues[iid].push(req.arrival + req.slo.ttft, req.arrival, self._seq,
                                   model.prefill_one(req.prompt_len), req)
        self._num_waiting += len(self._pending)
        self._pending.clear()

        alpha, beta, delta = model.decode_b, model.decode_c, model.decode_a
        # Walked: every dirty instance with a queue, and every clean one whose guard's next
        # rejection is due (or that has none yet); the others would decide as last time.
        walk = {iid for iid in self._dirty if iid in self._place and self._queues[iid]}
        heap = self._rejections
        while heap and heap[0][0] <= now:
            at, iid = heapq.heappop(heap)
            if self._live(at, iid):
                walk.add(iid)
        for inst in [targets[k] for k in sorted(self._place[iid] for iid in walk)]:
            queue, sh = self._queues[inst.id], self.shadow[inst.id]
            self._dirty.discard(inst.id)
            mix = TPOTMix.of(sh)
            # TTFT guard: cumulative predicted prefill in deadline order.
            rejected = queue.guard(now)
            decision.reject.extend(rejected)
            # Admission by predicted TPOT, in deadline order.
            admitted: list[int] = []
            for k in range(len(queue)):
                if sh.free_slots() <= 0:
                    break  # no slot, and the instance is not idle: nothing more is admitted
                req = queue.request(k)
                assert req.slo is not None
                out_len = self._predict(req)
                fits = req.prompt_len + out_len <= sh.free_kv_tokens()
                if (fits and self.predicted_tpot(sh, mix, req, out_len, alpha, beta, delta)
                        <= mix.tightest_with(req.slo.tpot)) or sh.idle:
                    # (An idle instance admits it: there is no TPOT to protect.)
                    decision.dispatch.append(Dispatch(req, inst.id))
                    sh.add(req, out_len)
                    mix.add(req.slo.tpot)
                    admitted.append(k)
            queue.remove(admitted)
            self._num_waiting -= len(rejected) + len(admitted)
            # The guard rejects a waiting request once now + Σ prefill up to it > its deadline.
            reject_at = queue.reject_at()
            self._reject_at[inst.id] = reject_at
            if reject_at < math.inf:
                heapq.heappush(heap, (reject_at, inst.id))
        while heap and not self._live(*heap[0]):
            heapq.heappop(heap)
        next_reject = heap[0][0] if heap else math.inf
        if next_reject < math.inf:  # at the next iteration boundary, or when the guard acts
            decision.wake_at = max(now + max(model.decode_a, 1e-3), next_reject)
        return decision

    def _live(self, at: float, iid: int) -> bool:
        """Whether a rejection-heap entry still stands (see ``_rejections``)."""
        return self._reject_at.get(iid) == at and iid in self._place and bool(self._queues[iid])

    def _predict(self, req: Request) -> float:
        if self.predictor.mode == "oracle":
            return self.predictor.predict(req)
        out = self._out_len.get(req.task)
        if out is None:
            out = self._out_len[req.task] = self.predictor.predict(req)
        return out

    def on_instance_removed(self, instance_id: int) -> None:
        self._dirty.discard(instance_id)
        self._reject_at.pop(instance_id, None)
        queue = self._queues.pop(instance_id, DeadlineQueue())
        self._num_waiting -= len(queue)
        self._pending.extend(queue.requests())

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        self.shadow.finished(record, record.instance, self.predictor)
        if record.instance is not None:
            self._dirty.add(record.instance)
