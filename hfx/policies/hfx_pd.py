# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""HFX in P/D-disaggregated mode (HyperFlexis §5.1 "PD-Disaggregated Architecture"; HFX paper
§3.3.1 "Disaggregated Mode"): the four dispatching steps run twice, once per stage.

P stage (``HFXPrefillDispatcher``, over prefill instances): a prefill batch cannot be interrupted,
so an instance matures when its current prefill batch completes (step 4), and its token budget
is the number of tokens whose prefill fits the strictest TTFT in the queue,
(TTFT_min − a) / b (step 2). Admission (calculate_p ≥ θ) is as in colocated mode.

D stage (``HFXMigrator``, over decode instances): a queue of prefilled requests ordered by
(TPOT, arrival). At every decode iteration boundary of a mature instance it admits requests
while the predicted decode step with them joined stays within the strictest TPOT of the
instance's in-flight requests (the queue's strictest when the instance is idle) — the budget of
step 2 — and while their KV and sequence slots fit. Maturity is the end of the next decode
iteration (step 4).
"""

from __future__ import annotations

from hfx.policies.base import ClusterView, Decision, Dispatch, Policy
from hfx.policies.hfx import HFXDispatcher
from hfx.policies.maturity import MaturityQueue
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.shadow import ShadowInstance, Shadows
from hfx.policies.slo_queue import SLOQueue
from hfx.request import Request, RequestRecord
from hfx.stepmodel.latency import StepTimeModel


class HFXPrefillDispatcher(HFXDispatcher):
    name = "hfx"
    planner = "prefill-first"  # P/D (HyperFlexis §5.1): prefill instances run whole prompts
    # No decode to guard on a prefill instance, so nothing to override: the seed's P stage.
    default_override = "off"
    default_parts = "off"  # one part: prefill instances keep no TPOT

    def decode_step(self, sh: ShadowInstance, model: StepTimeModel) -> float:
        return 0.0  # a prefill instance never decodes

    def budget(self, sh: ShadowInstance, model: StepTimeModel, e_d: float) -> float:
        ttft = self.queue.min_ttft()
        return float("inf") if ttft is None else (ttft - model.prefill_a) / model.prefill_b

    def next_maturity(self, now: float, e_p: float, sh: ShadowInstance,
                      model: StepTimeModel) -> float:
        return now + e_p

    def kv_reserve(self, request: Request) -> float:
        return 1.0  # the prompt's KV and the first token's, until migration


class HFXMigrator(Policy):
    name = "hfx-migrator"

    def __init__(self, max_scan: int = 512, output_length: str = "history") -> None:
        self.max_scan = max_scan
        self.queue = SLOQueue()
        self.predictor = OutputLengthPredictor(output_length)
        self.shadow = Shadows()
        self.maturity = MaturityQueue()

    def enqueue(self, request: Request, now: float) -> None:
        self.queue.push(request)

    def num_queued(self) -> int:
        return len(self.queue)

    def withdraw(self, request_id: str) -> bool:
        return self.queue.remove(request_id)

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        now, model = view.now, view.step_model
        targets = view.accepting()
        if self.shadow.follow(view, targets):
            self.maturity.members((i.id for i in targets), now)
        if not self.queue or not targets:
            return decision
        while self.queue:
            iid = self.maturity.pop_mature(now)
            if iid is None:
                break
            self._serve(iid, self.shadow[iid], model, now, decision)
        self.maturity.end_round()
        if self.queue:
            earliest = self.maturity.earliest()
            assert earliest is not None  # the accepting instances are its members
            decision.wake_at = max(earliest, now + model.decode_a / 4)
        return decision

    def _serve(self, iid: int, sh: ShadowInstance, model: StepTimeModel, now: float,
               decision: Decision) -> None:
        tpot = sh.min_tpot() or self.queue.min_tpot()
        assert tpot is not None  # called with a request queued
        ctx, batch = sh.decode_ctx, sh.batch_size
        kv_free, slots = sh.free_kv_tokens(), sh.free_slots()
        admitted: list[tuple[Request, float]] = []
        for req in self.queue.scan(self.max_scan):
            if len(admitted) >= slots:
                break
            out_len = self.predictor.predict(req)
            need = req.prompt_len + out_len
            assert req.slo is not None
            limit = min(tpot, req.slo.tpot)
            fits_tpot = model.decode_time(ctx + req.prompt_len + 1, batch + 1) <= limit
            if need <= kv_free and (fits_tpot or batch == 0):
                self.queue.take(req)
                admitted.append((req, out_len))
                ctx += req.prompt_len + 1
                batch += 1
                kv_free -= need
                tpot = limit
        for req, out_len in admitted:
            decision.dispatch.append(Dispatch(req, iid))
            sh.add(req, out_len)
        # Decide again at the end of the next decode iteration.
        self.maturity.set(iid, now + max(model.decode_time(ctx, batch), model.decode_a))

    def on_unplaced(self, request: Request, instance_id: int) -> None:
        # Undo _serve's add, or the shadow keeps a request that never arrives nor finishes
        # there: each one a sequence slot lost for good (found under decode KV pressure).
        if instance_id in self.shadow:
            self.shadow[instance_id].remove(request.id, request.prompt_len)

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        sh = self.shadow.finished(record, record.decode_instance, self.predictor)
        if sh is not None and sh.idle:
            self.maturity.set(sh.id, min(self.maturity[sh.id], view.now))
