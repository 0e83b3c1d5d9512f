"""The control plane: the global request path from arrival to the last token.

Arrivals go to the policy's queue; the policy's decisions go to instances; token events from the
instances update each request's record. ``schedule`` runs on every arrival, on a finished request
while the policy still holds queued work, on each Monitor snapshot, and at the wake-up time the
policy asked for. All times come from the running loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from hfx.cluster.instance import Instance
from hfx.cluster.monitor import Monitor
from hfx.cluster.slo_mapper import PriorityMapper
from hfx.engine import EngineError, RequestStatus, StepOutput
from hfx.latency import Profile, StepTimeModel
from hfx.policies import ClusterView, Decision, InstanceView, Policy
from hfx.request import Outcome, Request, RequestRecord


class ControlPlane:
    def __init__(
        self,
        instances: Sequence[Instance],
        policy: Policy,
        profile: Profile,
        *,
        step_model: StepTimeModel | None = None,
        monitor: Monitor | None = None,
        mapper: PriorityMapper | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a cluster needs at least one instance")
        self.instances: dict[int, Instance] = {inst.id: inst for inst in instances}
        self.policy = policy
        self.profile = profile
        self.monitor = monitor or Monitor()
        self.records: dict[str, RequestRecord] = {}
        self.mapper = mapper
        # Priority requests still waiting for their first token, for the mapper's contention
        # rule: id → priority, and a count per priority.
        self._awaiting: dict[str, int] = {}
        self._awaiting_count = [0] * (mapper.levels if mapper else 0)
        self.num_done = 0
        # Instance lifetimes on the loop's clock, for cost (seed 000 Eq. 3).
        self.active_since: dict[int, float] = {}
        self.released_at: dict[int, float] = {}
        self._view: ClusterView | None = None
        self._views: dict[int, InstanceView] = {}
        self._step_model = step_model or profile.model
        self._timer: asyncio.TimerHandle | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for inst in self.instances.values():
            inst.start(self.on_events)
            self.active_since[inst.id] = loop.time()
        snapshot = self.monitor.collect(self.instances.values())
        self._views = {i: InstanceView(i, s.role, s) for i, s in snapshot.items()}
        self._view = ClusterView(loop.time(), list(self._views.values()), self._step_model,
                                 self.profile)
        self.monitor.start(self.instances.values, self._on_snapshot)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self.monitor.stop()
        now = asyncio.get_running_loop().time()
        for inst in self.instances.values():
            await inst.stop()
            self.released_at.setdefault(inst.id, now)

    async def wait_idle(self) -> None:
        """Until every submitted request has reached a terminal outcome."""
        await self._idle.wait()

    # ---- requests --------------------------------------------------------------------------
    def submit(self, request: Request) -> RequestRecord:
        if request.id in self.records:
            raise ValueError(f"duplicate request id {request.id!r}")
        record = RequestRecord(request)
        self.records[request.id] = record
        self._idle.clear()
        if record.slo is None and request.priority is not None and self.mapper is not None:
            p = request.priority
            try:
                self.mapper.check(p)
            except ValueError as e:
                self._finish(record, Outcome.REJECTED, request.arrival, str(e))
                return record
            record.slo = self.mapper.assign(p, any(self._awaiting_count[:p]))
            record.target = self.mapper.ranges[p].nominal
            self._awaiting[request.id] = p
            self._awaiting_count[p] += 1
        if record.slo is None:
            why = ("a priority needs priority mapping (--priorities N)"
                   if request.priority is not None else "request has no SLO or priority")
            self._finish(record, Outcome.REJECTED, request.arrival, why)
            return record
        if request.slo is None:  # the policy sees the mapped SLO; the record keeps both
            request = replace(request, slo=record.slo)
        self.policy.enqueue(request, asyncio.get_running_loop().time())
        self._schedule()
        return record

    def abort(self, request_id: str) -> None:
        record = self.records.get(request_id)
        if record is None or record.outcome is not Outcome.PENDING:
            return
        if record.instance is not None:
            self.instances[record.instance].abort(request_id)
        else:  # still in the policy's queue: finish it now, and skip it when it is dispatched
            self._finish(record, Outcome.ABORTED, asyncio.get_running_loop().time())

    # ---- scheduling ------------------------------------------------------------------------
    def _schedule(self) -> None:
        view = self._view
        assert view is not None, "start() the control plane first"
        loop = asyncio.get_running_loop()
        view.now = loop.time()
        decision = self.policy.schedule(view)
        self._apply(decision, view.now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if decision.wake_at is not None:
            self._timer = loop.call_at(max(decision.wake_at, view.now), self._schedule)

    def _apply(self, decision: Decision, now: float) -> None:
        for d in decision.dispatch:
            record = self.records[d.request.id]
            if record.outcome is not Outcome.PENDING:
                continue  # aborted while queued
            record.dispatch_time = now
            record.instance = d.instance
            record.best_effort = d.best_effort
            try:
                self.instances[d.instance].submit(d.request)
            except EngineError as e:
                self._finish(record, Outcome.FAILED, now, str(e))
                continue
            view = self._views[d.instance]
            view.outstanding += 1
            view.outstanding_tokens += d.request.prompt_len + d.request.max_tokens
        for request in decision.reject:
            self._finish(self.records[request.id], Outcome.REJECTED, now, "rejected by policy")

    def _on_snapshot(self, snapshot: dict) -> None:
        for iid, stats in snapshot.items():
            self._views[iid].stats = stats
        if self.policy.num_queued():
            self._schedule()

    # ---- token events ----------------------------------------------------------------------
    def on_events(self, instance_id: int, out: StepOutput) -> None:
        """Sink of every instance's step outputs."""
        records = self.records
        now = out.time
        for rid in out.request_ids:
            records[rid].token_times.append(now)
        if self._awaiting:
            for rid in out.request_ids:
                self._first_token(rid)
        if not out.transitions:
            return
        view = self._views[instance_id]
        for rid, status in out.transitions:
            if not status.finished:
                continue  # PREFILLED: the P/D migrator's business
            record = records[rid]
            view.outstanding -= 1
            view.outstanding_tokens -= record.request.prompt_len + record.request.max_tokens
            outcome = (Outcome.ABORTED if status is RequestStatus.FINISHED_ABORTED
                       else Outcome.FINISHED)
            self._finish(record, outcome, now)
        if self.policy.num_queued():
            self._schedule()

    def _first_token(self, request_id: str) -> None:
        p = self._awaiting.pop(request_id, None)
        if p is not None:
            self._awaiting_count[p] -= 1

    def _finish(self, record: RequestRecord, outcome: Outcome, now: float,
                error: str | None = None) -> None:
        record.outcome = outcome
        record.finish_time = now
        record.error = error
        self.num_done += 1
        req = record.request
        if self._awaiting:
            self._first_token(req.id)
        if (self.mapper is not None and req.priority is not None and outcome is Outcome.FINISHED
                and record.queue_time is not None and 0 <= req.priority < self.mapper.levels):
            self.mapper.observe(req.priority, record.ttft, record.queue_time, record.tpot)
        if self._view is not None:
            self.policy.on_finished(record, self._view)
        if self.num_done == len(self.records):
            self._idle.set()
