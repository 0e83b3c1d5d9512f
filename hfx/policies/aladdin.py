# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``aladdin``: Aladdin (arXiv 2405.06856) request placement, with a fixed fleet.

Our reading of the paper's placement (its scaling half is out of scope here): each arriving
request goes to a *feasible* worker, and among feasible workers to the one with the least
remaining KV headroom after placing it (best fit, which packs workers and leaves others free for
large requests). A worker is feasible for request r when

- predicted TTFT is within the SLO: the worker's queued prefill work (a FCFS backlog that drains
  as the worker prefills) plus r's own prefill, from r's arrival;
- the predicted mean decode step over r's life is within the tightest TPOT of the batch it
  joins (r's and every in-flight request's there): Eq. 2 with the worker's batch plus r, every
  context grown by half of r's predicted output. Aladdin places a request only where every
  request of the worker keeps its SLO; testing r's TPOT alone let best fit pack four of 20
  workers past their tight tiers (tiered-512-512, 100 req/s);
- its KV can hold every in-flight request's prompt and predicted output, and r's.

Output length is predicted by the per-task historical mean. No migration; inside a worker,
FCFS continuous batching (the prefill-first engine). When no worker is feasible, the request
goes to the worker with the most headroom as best effort (Aladdin would add a worker instead).
"""

from __future__ import annotations

from hfx.policies.base import ArrivalOrderPolicy, ClusterView, Decision, Dispatch
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.shadow import Shadows
from hfx.request import RequestRecord


class Aladdin(ArrivalOrderPolicy):
    name = "aladdin"
    planner = "prefill-first"

    def __init__(self, output_length: str = "history") -> None:
        self.predictor = OutputLengthPredictor(output_length)
        super().__init__()
        self.shadow = Shadows()
        self._prefill_free_at: dict[int, float] = {}  # when the worker's prefill backlog drains

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        now, model = view.now, view.step_model
        targets = view.accepting()
        if not targets:
            return decision
        for inst in targets:
            self._prefill_free_at.setdefault(inst.id, now)
            self.shadow.sync(inst)
        while self._queue:
            req = self._queue.popleft()
            assert req.slo is not None
            out_len = self.predictor.predict(req)
            prefill = model.prefill_one(req.prompt_len)
            best, best_headroom, fallback, fallback_headroom = None, 0.0, None, -1.0
            for inst in targets:
                sh = self.shadow[inst.id]
                headroom = sh.free_kv_tokens() - req.prompt_len - out_len
                if headroom > fallback_headroom and sh.free_slots() > 0:
                    fallback, fallback_headroom = inst.id, headroom
                if headroom < 0 or sh.free_slots() <= 0:
                    continue
                start = max(now, self._prefill_free_at[inst.id])
                ttft = start + prefill - req.arrival
                b = sh.batch_size + 1
                mean_step = model.decode_time(sh.decode_ctx + req.prompt_len + b * out_len / 2, b)
                tpot = min(req.slo.tpot, sh.min_tpot() or req.slo.tpot)
                if ttft <= req.slo.ttft and mean_step <= tpot and (
                        best is None or headroom < best_headroom):
                    best, best_headroom = inst.id, headroom
            target, best_effort = (best, False) if best is not None else (fallback, True)
            if target is None:  # every worker is full: wait for a finish
                self._queue.appendleft(req)
                break
            decision.dispatch.append(Dispatch(req, target, best_effort=best_effort))
            self.shadow[target].add(req, out_len)
            self._prefill_free_at[target] = max(now, self._prefill_free_at[target]) + prefill
        return decision

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        self.shadow.finished(record, record.instance, self.predictor)
