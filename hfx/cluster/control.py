# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The control plane: the global request path from arrival to the last token.

It composes parts named for their jobs and routes events between them:

- ``RequestLedger`` (ledger.py): records, token listeners, who still awaits a first token;
- ``Stage`` (stage.py): a policy with its view and wake-up timer — dispatch, and in P/D the
  Migrator's stage inside ``Migration`` (migration.py, HyperFlexis §5.1);
- ``Fleet`` (fleet.py): membership, drain, role switch, views, KV links, cost;
- ``Recovery`` (recovery.py): what becomes of a failed instance's requests;
- ``FairShare`` (fair_share.py): start tags that order tenants' requests fairly, and the
  requests it holds for a dispatcher without a queue of its own (off unless given);
- ``OutlierDetector`` (outliers.py): which instances broken streams take out of dispatch for a
  while, never all of them;
- HFX-PM (slo_mapper.py): a priority becomes an SLO at arrival (HyperFlexis §5.2);
- ``AdmissionLimits`` (admission.py): the queue bound and the first-token wait bound that shed
  load, in simulation and serving alike.

Arrivals go to the dispatch stage (after priority mapping); its decisions go to instances; step
outputs from the instances update the ledger and call the stages again. The Scaler, when there
is one, acts on the fleet through the ``FleetControl`` methods below and hears of queue events
through its ``ScalerHooks``. All times come from the running loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from hfx.cluster.admission import AdmissionLimits
from hfx.cluster.fair_share import FairShare
from hfx.cluster.fleet import Fleet
from hfx.cluster.instance import Instance
from hfx.cluster.ledger import Listener, RequestLedger, TokenEvent
from hfx.cluster.migration import Migration
from hfx.cluster.monitor import Monitor
from hfx.cluster.outliers import EjectionPolicy, OutlierDetector
from hfx.cluster.recovery import Recovery
from hfx.cluster.slo_mapper import PriorityMapper
from hfx.cluster.stage import Stage
from hfx.cluster.tl_manager import TLManager
from hfx.engine.core import StepOutput
from hfx.engine.errors import EngineError
from hfx.engine.sequence import FINISH_REASON, RequestStatus, Role
from hfx.engine.stats import InstanceStats
from hfx.policies.base import ArrivalOrderPolicy, ClusterView, Decision, Policy
from hfx.policies.prefix_index import PrefixIndex
from hfx.request import Outcome, Request, RequestRecord
from hfx.stepmodel.latency import Profile, StepTimeModel

if TYPE_CHECKING:
    from hfx.cluster.scaler import ScalerState

__all__ = ["ControlPlane", "Listener", "ScalerHooks", "TokenEvent"]

log = logging.getLogger(__name__)

# Fair shares' saturation gate for dispatchers that place requests as they come (fair_share.py):
# requests such a dispatcher may queue per instance, and an instance's queue beyond its batch
# (the Gateway API Inference Extension's default queue-depth threshold, 5).
HOLD_PER_INSTANCE, QUEUE_DEPTH = 2, 5

_OUTCOME = {RequestStatus.FINISHED_ABORTED: Outcome.ABORTED,
            RequestStatus.FINISHED_FAILED: Outcome.FAILED}  # the rest finished
_WHOLE = frozenset((RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH))


class ScalerHooks(Protocol):
    """What the control plane tells a Scaler (hfx/cluster/scaler.py)."""

    state: ScalerState  # its scaling events and fleet sizes, for the reports

    def on_enqueue(self, role: Role, t: float) -> None: ...

    def on_dequeue(self, role: Role, t: float) -> None: ...

    def on_drained(self, instance_id: int) -> None: ...

    def on_failed(self, instance_id: int, role: Role) -> None: ...

    def launching(self, role: Role | None = None) -> int:
        """Instances it is starting now, in ``role`` if given."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


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
        migrator: Policy | None = None,
        tl_manager: TLManager | None = None,
        max_retries: int = 1,
        admission: AdmissionLimits | None = None,
        mixed_steps: bool = False,
        step_tokens: int | None = None,
        prefix: PrefixIndex | None = None,
        ejection: EjectionPolicy | None = None,
        fair: FairShare | None = None,
    ) -> None:
        self.fleet = Fleet(instances, monitor or Monitor(), tl_manager, prefix)
        if self.fleet.pd and migrator is None:
            raise ValueError("P/D needs prefill and decode instances, a migrator and a "
                             "TLManager; colocated instances cannot mix with them")
        self.policy = policy
        self.migrator = migrator
        self.profile = profile
        self.step_model = step_model or profile.model  # the dispatcher's predictions
        self.mixed_steps = mixed_steps  # the engines' prefill steps also decode (ClusterView)
        self.step_tokens = step_tokens  # their per-step token budget when it chunks prompts
        self.mapper = mapper
        self.ledger = RequestLedger(mapper.levels if mapper else 0)
        self.recovery = Recovery(max_retries, self.fleet.pd)
        self.outliers = OutlierDetector(ejection or EjectionPolicy())
        self.fair = fair  # tenants' shares while saturated; None: arrival order throughout
        self._slots = (-1, 0)  # (view version, the sequences its accepting instances run)
        self._ejections: dict[int, asyncio.Task[None]] = {}  # each ejected instance's timer
        self.scaler: ScalerHooks | None = None
        self._unserviceable = "every instance has left"  # the last instance failure, if any
        self.admission = admission or AdmissionLimits()
        # Requests aborted on their instances for a reason other than the client's: the outcome,
        # finish reason and error they end with when the abort lands (a stop string: finished).
        self._ending: dict[str, tuple[Outcome, str | None, str | None]] = {}
        self._deadlines: dict[str, asyncio.TimerHandle] = {}  # first-token wait bounds
        self._dispatch: Stage | None = None
        self.migration: Migration | None = None

    # ---- what callers read -----------------------------------------------------------------
    @property
    def records(self) -> dict[str, RequestRecord]:
        return self.ledger.records

    @property
    def num_done(self) -> int:
        return self.ledger.num_done

    @property
    def instances(self) -> dict[int, Instance]:
        return self.fleet.instances

    @property
    def retired(self) -> dict[int, Instance]:
        return self.fleet.retired

    @property
    def pd(self) -> bool:
        return self.fleet.pd

    @property
    def tl(self) -> TLManager | None:
        return self.fleet.tl

    @property
    def monitor(self) -> Monitor:
        return self.fleet.monitor

    @property
    def num_instance_failures(self) -> int:
        return self.recovery.num_instance_failures

    @property
    def num_resumed(self) -> int:
        return self.recovery.num_resumed

    def _stages(self) -> Iterator[Stage]:
        if self._dispatch is not None:
            yield self._dispatch
        if self.migration is not None:
            yield self.migration.stage

    # ---- lifecycle -------------------------------------------------------------------------
    def attach_scaler(self, scaler: ScalerHooks) -> None:
        """Before ``start``: the Scaler hears queue events and decides what a drained instance
        does next."""
        self.scaler = scaler
        self.fleet.on_drained = scaler.on_drained

    def set_step_model(self, model: StepTimeModel) -> None:
        """The dispatcher's predictions from now on (a calibration while serving); policies
        read the view's model on each decision, and PolyServe rebuilds its table when it
        changes."""
        self.step_model = model
        for stage in self._stages():
            stage.view.step_model = model

    async def start(self) -> None:
        fleet = self.fleet
        now = asyncio.get_running_loop().time()
        fleet.start(self.on_events, now)
        view = ClusterView(now, fleet.members_view(Role.PREFILL if fleet.pd else None),
                           self.step_model, self.profile, mixed_steps=self.mixed_steps,
                           prefix=fleet.prefix, step_tokens=self.step_tokens)
        self._dispatch = Stage("dispatch", self.policy, view, self._apply)
        if fleet.pd:
            assert self.migrator is not None and fleet.tl is not None
            self.migration = Migration(self.migrator, fleet, self.ledger, fleet.tl,
                                       self._dispatch, self._finish)
            if self.scaler is not None:
                scaler = self.scaler
                self.migration.on_enqueue = lambda t: scaler.on_enqueue(Role.DECODE, t)
                self.migration.on_dequeue = lambda t: scaler.on_dequeue(Role.DECODE, t)
            fleet.stages = {Role.PREFILL: self._dispatch, Role.DECODE: self.migration.stage}
        else:
            fleet.stages = {Role.COLOCATED: self._dispatch}
        fleet.monitor.start(fleet.instances.values, self._on_snapshot)

    async def stop(self) -> None:
        for stage in self._stages():
            stage.stop()
        for iid in list(self._ejections):
            self._forget_task(iid)
        await self.fleet.monitor.stop()
        if self.scaler is not None:
            self.scaler.stop()
        await self.fleet.stop()

    async def wait_idle(self) -> None:
        """Until every submitted request has reached a terminal outcome."""
        await self.ledger.wait_idle()

    # ---- requests --------------------------------------------------------------------------
    def submit(self, request: Request, listener: Listener | None = None,
               token_events: bool = True) -> RequestRecord:
        """Queue ``request``; ``listener`` hears each token it samples (real executors;
        unless ``token_events`` is False) and then one final event, also when it is rejected
        or fails."""
        record = self.ledger.open(request, listener, token_events)
        if record.slo is None and request.priority is not None and self.mapper is not None:
            p = request.priority
            try:
                self.mapper.check(p)
            except ValueError as e:
                self._finish(record, Outcome.REJECTED, request.arrival, str(e))
                return record
            record.slo = self.mapper.assign(p, self.ledger.higher_pending(p))
            record.target = self.mapper.ranges[p].nominal
            self.ledger.await_first(record, p)
        why: str | None  # why it is turned away, if it is
        if record.slo is None:
            why = ("a priority needs priority mapping (--priorities N)"
                   if request.priority is not None else "request has no SLO or priority")
            self._finish(record, Outcome.REJECTED, request.arrival, why)
            return record
        why = self.serviceable() or self._never_fits(request)
        if why is not None:
            self._finish(record, Outcome.FAILED, request.arrival, f"no instance can serve: {why}")
            return record
        assert self._dispatch is not None, "start() the control plane first"
        why = self.admission.queue_full(self.num_queued())
        if why is not None:
            self._finish(record, Outcome.SHED, request.arrival, why)
            return record
        if request.slo is None:  # the policy sees the mapped SLO; the record keeps both
            request = replace(request, slo=record.slo)
        loop = asyncio.get_running_loop()
        deadline = self.admission.first_token_deadline(record)
        if deadline is not None:
            self._deadlines[request.id] = loop.call_at(deadline, self._shed_late, request.id)
        if self.scaler is not None:
            self.ledger.await_first(record)
            self.scaler.on_enqueue(Role.PREFILL if self.pd else Role.COLOCATED,
                                   request.arrival)
        if self.migration is not None:
            self.migration.sent[request.id] = request
        if self.fair is not None:
            self.fair.tag(request, loop.time())
            self._fair_moved(loop.time())
            if self.fair.num_held or self._must_hold():
                self.fair.hold(request)  # it goes when its turn comes and there is room
                self._release()
                return record
        self._dispatch.enqueue(request, loop.time())
        self._dispatch.schedule()
        return record

    def num_queued(self) -> int:
        """Requests waiting for a placement: the dispatcher's, and those fair shares hold."""
        assert self._dispatch is not None
        held = self.fair.num_held if self.fair is not None else 0
        return self._dispatch.policy.num_queued() + held

    # ---- fair shares (fair_share.py) ---------------------------------------------------------
    def _must_hold(self) -> bool:
        """A dispatcher that serves one queue in arrival order (it places requests as they
        come) is saturated: it queues ``HOLD_PER_INSTANCE`` requests per instance taking work,
        or every such instance queues ``QUEUE_DEPTH`` beyond what it runs at once (the Gateway
        API Inference Extension's saturation detector: a queue depth per endpoint). A
        dispatcher with a queue of its own orders it by start tag instead (SLOQueue). One
        tenant alone is never held."""
        stage = self._dispatch
        assert stage is not None
        if (not isinstance(stage.policy, ArrivalOrderPolicy) or self.fair is None
                or not self.fair.contended()):
            return False
        targets = stage.view.accepting()
        if stage.policy.num_queued() >= HOLD_PER_INSTANCE * max(1, len(targets)):
            return True
        return bool(targets) and all(
            max(v.stats.num_waiting, v.outstanding - v.stats.max_num_seqs) >= QUEUE_DEPTH
            for v in targets)

    def _fair_moved(self, now: float) -> None:
        """Tags were given, placed or ended: who is past its share moved (of the service, for
        scope "fleet"; of the fleet's sequences, for the kept ones)."""
        fair, stage = self.fair, self._dispatch
        if fair is not None and stage is not None:
            view = stage.view
            view.fair_past = fair.past_share() if fair.scope == "fleet" else None
            if fair.reserve:
                if self._slots[0] != view.version:
                    self._slots = (view.version,
                                   sum(v.stats.max_num_seqs for v in view.accepting()))
                view.fair_shares = fair.shares(self._slots[1], now)
                view.fair_running = fair.running
                view.fair_reserve = fair.reserve

    def _release(self) -> None:
        """Held requests to the dispatcher, in fair order, while there is room."""
        fair, stage = self.fair, self._dispatch
        if fair is None or not fair.num_held or stage is None:
            return
        now = asyncio.get_running_loop().time()
        for request in fair.release(self._must_hold):
            stage.enqueue(request, now)
            stage.schedule()

    def forget(self, request_id: str) -> RequestRecord | None:
        """Drop a finished request's record; returns it, or None if unknown or pending."""
        return self.ledger.forget(request_id)

    def abort(self, request_id: str, finished: bool = False) -> None:
        """Abort a request wherever it is; each instance holding it reports the abort.
        ``finished``: the output is complete (the gateway found a stop string): it ends as
        finished with reason "stop", and its latencies count."""
        record = self.records.get(request_id)
        if record is None or record.outcome is not Outcome.PENDING:
            return
        ending = (Outcome.FINISHED, "stop", None) if finished else None
        self._end(record, Outcome.ABORTED, None, ending)

    def _end(self, record: RequestRecord, outcome: Outcome, error: str | None,
             ending: tuple[Outcome, str | None, str | None] | None) -> None:
        """End a pending request wherever it is: a queued one now with ``outcome``; one on an
        instance once its abort lands there, with ``ending`` (outcome, reason, error) if given,
        else as aborted."""
        rid = record.request.id
        if record.instance is None:  # still in the dispatch queue, or held for its turn
            assert self._dispatch is not None
            if self.fair is None or not self.fair.withdraw(rid):
                self._dispatch.policy.withdraw(rid)
            self._finish(record, outcome, asyncio.get_running_loop().time(), error)
            return
        # Remembered until the abort lands: a stream that breaks meanwhile, or an instance
        # that fails, must not resume what was ended (the first reason given wins).
        self._ending.setdefault(rid, ending or (Outcome.ABORTED, "abort", None))
        self.instances[record.instance].abort(rid)
        if record.decode_instance is not None:
            self.instances[record.decode_instance].abort(rid)

    def _shed_late(self, request_id: str) -> None:
        """The first-token wait bound passed (admission.py): shed the request if it still has
        no token, wherever it waits."""
        self._deadlines.pop(request_id, None)
        record = self.records.get(request_id)
        if record is None or record.outcome is not Outcome.PENDING or record.num_tokens:
            return
        why = self.admission.late()
        self._end(record, Outcome.SHED, why, (Outcome.SHED, None, why))

    def serviceable(self) -> str | None:
        """None while every stage has an instance that can take work, or one starting; else
        why not. In P/D that is both stages: with no decode instance left, a prefilled request
        would wait for the Migrator forever."""
        stalled = self._stalled_stage()
        return None if stalled is None else self._unserviceable

    def _stalled_stage(self) -> Role | None:
        """The first stage with no instance able to take work and none starting (the Scaler
        keeps one instance in each pool, so only failures empty one)."""
        for role in (Role.PREFILL, Role.DECODE) if self.pd else (Role.COLOCATED,):
            if any(self.fleet.accepting(i) and self.fleet.role_of(i) is role
                   for i in self.instances):
                continue
            if self.scaler is not None and self.scaler.launching(role):
                continue
            return role
        return None

    def _never_fits(self, request: Request) -> str | None:
        """Why no instance of a stage the request passes through could ever run it (its size
        against their context and KV), else None. Checked at submit: a policy that holds
        requests until an instance has room (PolyServe, HFX's Q_W) would hold it forever. The
        first instance that fits ends the walk, so a homogeneous fleet costs one check."""
        for stage in self._stages():
            refusals: list[str] = []
            for view in stage.view.instances:
                instance = self.instances.get(view.id)
                if instance is None:
                    continue  # left since the view was taken
                try:
                    instance.check(request)
                    break  # this one fits: the stage can serve it
                except EngineError as e:
                    refusals.append(str(e))
            else:
                if refusals:
                    return refusals[0]
        return None

    def check_serviceable(self) -> None:
        """With a stage unable to take work and nothing starting for it, the requests bound
        for it would wait forever: fail them now with the reason (the gateway answers new ones
        503). A dead decode stage also ends the prefilled requests, aborting them where their
        KV is held."""
        self._readmit_if_stalled()  # ejection never leaves a pool empty
        stalled = self._stalled_stage()
        if stalled is None:
            return
        why = f"no instance can serve: {self._unserviceable}"
        ending = (Outcome.FAILED, None, why)
        for record in list(self.records.values()):
            if record.outcome is not Outcome.PENDING:
                continue
            if record.instance is None:
                self._end(record, Outcome.FAILED, why, ending)  # out of the policy's queue too
            elif stalled is Role.DECODE and record.decode_instance is None:
                self._end(record, Outcome.FAILED, why, ending)

    # ---- decisions and events --------------------------------------------------------------
    def _apply(self, decision: Decision, now: float) -> None:
        """The dispatch stage's decision: requests to instances, rejections."""
        for d in decision.dispatch:
            record = self.records[d.request.id]
            if record.outcome is not Outcome.PENDING:
                continue  # aborted while queued
            record.dispatch_time = now
            record.instance = d.instance
            if self.fair is not None:
                self.fair.dispatched(d.request)
            record.best_effort = d.best_effort
            if self.scaler is not None:
                self.scaler.on_dequeue(Role.PREFILL if self.pd else Role.COLOCATED, now)
            try:
                self.instances[d.instance].submit(d.request, d.best_effort)
            except EngineError as e:
                self._finish(record, Outcome.FAILED, now, str(e))
                continue
            self.fleet.count(d.instance, d.request, +1)
            if self.fleet.prefix is not None:
                self.fleet.prefix.routed(d.instance, d.request)
        for request in decision.reject:
            self._finish(self.records[request.id], Outcome.REJECTED, now, "rejected by policy")
        if decision.dispatch:
            self._fair_moved(now)

    def _on_snapshot(self, snapshot: dict[int, InstanceStats]) -> None:
        self.fleet.on_snapshot(snapshot)
        for stage in self._stages():
            stage.schedule_if_queued()
        self._release()

    def on_events(self, instance_id: int, out: StepOutput) -> None:
        """Sink of every instance's step outputs."""
        if out.error is not None:
            self._on_instance_failed(instance_id, out)
            return
        self.ledger.on_tokens(out, instance_id)
        if not out.transitions:
            return
        records, now = self.records, out.time
        prefilled = finished = False
        for rid, status in out.transitions:
            if status is RequestStatus.PREFILLED:
                assert self.migration is not None
                self.outliers.success(instance_id)
                self.migration.on_prefilled(rid, now)
                prefilled = True
                continue
            if status is RequestStatus.FINISHED_LOST:
                self._fault(instance_id, now)  # before it resumes: not onto an ejected one
            elif status in _WHOLE:
                self.outliers.success(instance_id)
            record = records[rid]
            self.fleet.count(instance_id, record.request, -1)
            self.fleet.check_drained(instance_id)
            if record.outcome is not Outcome.PENDING:
                continue  # closed by the other instance of a migration aborted in flight
            if status is RequestStatus.FINISHED_LOST:
                self._on_lost(record, instance_id, now, out.failure)
                finished = True  # it left the instance: room for what waits
                continue
            outcome = _OUTCOME.get(status, Outcome.FINISHED)
            reason = FINISH_REASON[status]
            error = out.failure if status is RequestStatus.FINISHED_FAILED else None
            if status is RequestStatus.FINISHED_ABORTED and rid in self._ending:
                outcome, reason, error = self._ending[rid]  # a stop string, or shed
            self._finish(record, outcome, now, error, reason=reason)
            finished = True
        if finished and self.migration is not None:
            self.migration.on_finished(now)
        if finished or prefilled:
            for stage in self._stages():
                stage.schedule_if_queued()
            self._release()

    def _on_instance_failed(self, instance_id: int, out: StepOutput) -> None:
        """Take the instance out of service, resume what it held elsewhere where that is safe,
        fail the rest with the reason; the Scaler replaces it. ``out.transitions`` lists every
        request the instance held."""
        now = out.time
        role = self.fleet.role_of(instance_id)
        if role is None:
            return  # already gone (released, or between roles)
        self.recovery.num_instance_failures += 1
        self._unserviceable = out.error or self._unserviceable
        self._forget_ejection(instance_id)
        self.fleet.drain(instance_id)  # no new work there: retries go elsewhere
        for rid, _ in out.transitions:
            record = self.records[rid]
            self.fleet.count(instance_id, record.request, -1)
            if record.outcome is not Outcome.PENDING:
                continue
            self._recover(record, instance_id, now, out.error, suspect=rid in out.suspects)
        self.fleet.check_drained(instance_id)
        if self.scaler is not None:
            self.scaler.on_failed(instance_id, role)
        self.check_serviceable()
        for stage in self._stages():
            stage.schedule_if_queued()

    # ---- outlier ejection (outliers.py) -----------------------------------------------------
    def _fault(self, instance_id: int, now: float) -> None:
        """A stream broke on the instance: eject it if its faults in a row say so and the
        share bound allows."""
        fleet = self.fleet
        role = fleet.role_of(instance_id)
        if role is None or instance_id in fleet.draining:
            return
        pool = [i for i in self.instances
                if fleet.role_of(i) is role and i not in fleet.draining]
        until = self.outliers.fault(instance_id, now, pool,
                                    [i for i in pool if fleet.accepting(i)])
        if until is None:
            return
        log.warning("instance %d: %d broken streams in a row; it takes no new requests for "
                    "%.0f s (what it runs goes on)", instance_id,
                    self.outliers.policy.consecutive, until - now)
        fleet.eject(instance_id)
        self._ejection_ends(instance_id, until)

    def _ejection_ends(self, instance_id: int, until: float) -> None:
        self._ejections[instance_id] = asyncio.get_running_loop().create_task(
            self._eject_until(instance_id, until), name=f"ejected-{instance_id}")

    async def _eject_until(self, instance_id: int, until: float) -> None:
        """Wait out the ejection; then the instance's health check (where it has one) decides
        whether it takes work again or waits another base ejection time."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, until - loop.time()))
        check = getattr(self.instances.get(instance_id), "health_check", None)
        why = await check() if check is not None else None
        if not self.outliers.is_ejected(instance_id):
            return  # re-admitted early, or gone, meanwhile
        if why is not None:
            until = self.outliers.extend(instance_id, loop.time())
            log.warning("instance %d stays ejected for %.0f s more: its health check failed: "
                        "%s", instance_id, until - loop.time(), why)
            self._ejection_ends(instance_id, until)
            return
        self._ejections.pop(instance_id, None)
        self._readmit(instance_id)

    def _readmit(self, instance_id: int) -> None:
        if self.outliers.readmit(instance_id, asyncio.get_running_loop().time()):
            log.info("instance %d takes new requests again", instance_id)
            self.fleet.readmit(instance_id)
            self._release()

    def _forget_ejection(self, instance_id: int) -> None:
        """The instance leaves (failed, drained): its ejection, if any, with it."""
        self._forget_task(instance_id)
        self.outliers.forget(instance_id)

    def _readmit_if_stalled(self) -> None:
        """Ejection never leaves a pool without an instance taking work: when the last one
        leaves (failed, drained), the ejected ones of its pool come back at once."""
        fleet = self.fleet
        for iid in self.outliers.ejected_now():
            role = fleet.role_of(iid)
            if role is None or any(fleet.accepting(i) and fleet.role_of(i) is role
                                   for i in self.instances):
                continue
            log.warning("instance %d is re-admitted before its ejection ends: no other "
                        "instance of its pool takes work", iid)
            self._forget_task(iid)
            self._readmit(iid)

    def _forget_task(self, instance_id: int) -> None:
        task = self._ejections.pop(instance_id, None)
        if task is not None:
            task.cancel()

    def _on_lost(self, record: RequestRecord, instance_id: int, now: float,
                 why: str | None) -> None:
        """One request's stream broke on a server that may be fine: it costs the
        request, not the fleet."""
        if self._recover(record, instance_id, now, why):
            self.recovery.num_lost_resumed += 1
        self.check_serviceable()

    def _recover(self, record: RequestRecord, instance_id: int, now: float, why: str | None,
                 suspect: bool = False) -> bool:
        """A request its instance lost (alone, or with the instance): ended as it was being
        ended (aborted, a stop string, shed), else resumed elsewhere where that is safe, else
        failed with ``why``. Returns whether it resumed."""
        rid = record.request.id
        dst = record.decode_instance
        if dst is not None and dst != instance_id and dst in self.instances:
            self.instances[dst].abort(rid)  # its KV was on its way there: free the room
        if rid in self._ending:
            outcome, reason, error = self._ending[rid]
            self._finish(record, outcome, now, error, reason=reason)
        elif self.recovery.resumable(record, instance_id, suspect=suspect):
            self._resume(record, now)
            return True
        else:
            self._finish(record, Outcome.FAILED, now, why)
        return False

    def _resume(self, record: RequestRecord, now: float) -> None:
        if record.num_tokens >= record.request.max_tokens:
            self._finish(record, Outcome.FINISHED, now, reason="length")  # only the end lost
            return
        stage = self._dispatch
        assert stage is not None
        stage.policy.on_finished(record, stage.view)  # it left the instance it was on
        rest = self.recovery.continuation(record)
        if self.migration is not None:
            self.migration.sent[rest.id] = rest
        stage.enqueue(rest, now)

    def _finish(self, record: RequestRecord, outcome: Outcome, now: float,
                error: str | None = None, reason: str | None = None) -> None:
        self.ledger.settle(record, outcome, now, error)
        req = record.request
        if self.fair is not None:
            self.fair.finished(req.id, record.num_tokens)
            self._fair_moved(now)
        if self.fleet.prefix is not None:
            self.fleet.prefix.forget(req.id)
        self._ending.pop(req.id, None)  # however it ended
        deadline = self._deadlines.pop(req.id, None)
        if deadline is not None:
            deadline.cancel()
        if self.migration is not None:
            self.migration.forget(req.id)
        if (self.mapper is not None and req.priority is not None and outcome is Outcome.FINISHED
                and record.queue_time is not None and 0 <= req.priority < self.mapper.levels):
            assert record.ttft is not None and record.tpot is not None  # finished: has tokens
            self.mapper.observe(req.priority, record.ttft, record.queue_time, record.tpot)
        last = (self.migration.stage if self.migration is not None
                and record.decode_instance is not None else self._dispatch)
        if last is not None:
            last.policy.on_finished(record, last.view)
        self.ledger.announce(record, reason)

    # ---- FleetControl: what the Scaler acts through ----------------------------------------
    def roles(self) -> dict[int, Role]:
        """Every instance holding a device (serving or draining) and its role."""
        return {i: inst.role for i, inst in self.instances.items()}

    def accepting(self, instance_id: int) -> bool:
        return self.fleet.accepting(instance_id)

    def stats(self, instance_id: int) -> InstanceStats:
        return self.instances[instance_id].stats()

    def waiting(self, role: Role) -> Iterator[tuple[float, float]]:
        """(waiting since, SLO) of queued requests: without a first token (colocated, prefill),
        or prefilled and not yet migrated (decode) — the Scaler's W indicator."""
        if role is Role.DECODE:
            if self.migration is not None:
                yield from self.migration.waiting()
        else:
            yield from self.ledger.awaiting()

    def drain(self, instance_id: int) -> None:
        self._forget_ejection(instance_id)
        self.fleet.drain(instance_id)
        self._readmit_if_stalled()

    def release(self, instance_id: int) -> None:
        self.fleet.release(instance_id)

    def switch_role(self, instance_id: int, role: Role, ready_at: float) -> None:
        self.fleet.switch_role(instance_id, role, ready_at)

    def add_instance(self, instance: Instance, provisioned_at: float) -> None:
        self.fleet.add_instance(instance, provisioned_at)

    def record_span(self, instance_id: int, since: float, until: float) -> None:
        self.fleet.record_span(instance_id, since, until)

    def launch_failed(self, instance_id: int, error: str) -> None:
        """A launch the Scaler started failed: if nothing else can serve, say so now."""
        self._unserviceable = f"launching instance {instance_id} failed: {error}"
        self.check_serviceable()
