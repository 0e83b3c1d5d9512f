"""The control plane: the global request path from arrival to the last token.

Arrivals go to the dispatch policy's queue (after priority mapping, if the request carries a
priority); the policy's decisions go to instances; step outputs from the instances update each
request's record. In P/D mode (seed 000 §5.1) a second stage, the Migrator, owns the prefilled
requests: its decisions move a request's KV from its prefill instance to a decode instance over
the TLManager's links.

A stage's policy is called on every arrival into its queue, on a finished request while it still
holds queued work, on each Monitor snapshot, and at the wake-up time it asked for. All times come
from the running loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hfx.cluster.instance import Instance
from hfx.cluster.monitor import Monitor
from hfx.cluster.slo_mapper import PriorityMapper
from hfx.cluster.tl_manager import TLManager
from hfx.engine import FINISH_REASON, EngineError, RequestStatus, Role, StepOutput
from hfx.engine.executor import PLACEHOLDER_TOKEN
from hfx.latency import Profile, StepTimeModel
from hfx.policies import ClusterView, Decision, InstanceView, Policy
from hfx.request import Outcome, Request, RequestRecord


@dataclass(slots=True)
class _Stage:
    """One scheduling stage: a policy, the instances it sees, its wake-up timer."""

    policy: Policy
    view: ClusterView
    timer: asyncio.TimerHandle | None = None


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """What a listener hears about one request: a sampled token (PLACEHOLDER_TOKEN from a
    simulated executor), or the end (token None)."""

    token: int | None
    finish_reason: str | None = None  # "stop", "length", "abort", or "error" with ``error``
    error: str | None = None


Listener = Callable[[TokenEvent], None]


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
    ) -> None:
        if not instances:
            raise ValueError("a cluster needs at least one instance")
        self.instances: dict[int, Instance] = {inst.id: inst for inst in instances}
        roles = {inst.role for inst in instances}
        self.pd = Role.PREFILL in roles or Role.DECODE in roles
        if self.pd and (roles != {Role.PREFILL, Role.DECODE} or migrator is None
                        or tl_manager is None):
            raise ValueError("P/D needs prefill and decode instances, a migrator and a "
                             "TLManager; colocated instances cannot mix with them")
        self.policy = policy
        self.migrator = migrator
        self.tl = tl_manager
        self.profile = profile
        self.monitor = monitor or Monitor()
        self.records: dict[str, RequestRecord] = {}
        self.mapper = mapper
        self.max_retries = max_retries  # resumptions elsewhere after an instance fails
        # Requests still waiting for their first token, tracked when the mapper (contention
        # rule) or the scaler (its W indicator) needs them, with a count per priority.
        self._awaiting: dict[str, RequestRecord] = {}
        self._awaiting_count = [0] * (mapper.levels if mapper else 0)
        self._to_migrate: dict[str, tuple[float, float]] = {}  # P/D: prefilled at, TPOT
        self.scaler = None  # set by hfx.cluster.scaler.Scaler
        self.retired: dict[int, Instance] = {}  # released instances, kept for the record
        self._draining: set[int] = set()
        self.num_done = 0
        self.num_instance_failures = 0
        self.num_resumed = 0  # requests resumed elsewhere after their instance failed
        # Instance lifetimes on the loop's clock, for cost (seed 000 Eq. 3).
        self.active_since: dict[int, float] = {}
        self.released_at: dict[int, float] = {}
        self._views: dict[int, InstanceView] = {}
        self._step_model = step_model or profile.model
        self._dispatch: _Stage | None = None
        self._migrate: _Stage | None = None
        self._sent: dict[str, Request] = {}  # P/D: the request as the policies see it
        self._blocked: list[Request] = []  # P/D: migrations waiting for decode KV
        self._idle = asyncio.Event()
        self._idle.set()
        self._listeners: dict[str, Listener] = {}  # request id → who streams its tokens

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for inst in self.instances.values():
            inst.start(self.on_events)
            self.active_since[inst.id] = now
        snapshot = self.monitor.collect(self.instances.values())
        self._views = {i: InstanceView(i, s.role, s) for i, s in snapshot.items()}

        def view(role: Role | None) -> ClusterView:
            members = [v for v in self._views.values() if role is None or v.role is role]
            return ClusterView(now, members, self._step_model, self.profile)

        if self.pd:
            assert self.migrator is not None and self.tl is not None
            self._dispatch = _Stage(self.policy, view(Role.PREFILL))
            self._migrate = _Stage(self.migrator, view(Role.DECODE))
            for v in self._views.values():  # links before anyone serves (seed 000 §6)
                (self.tl.add_prefill if v.role is Role.PREFILL else self.tl.add_decode)(v.id)
        else:
            self._dispatch = _Stage(self.policy, view(None))
        self.monitor.start(self.instances.values, self._on_snapshot)

    async def stop(self) -> None:
        for stage in (self._dispatch, self._migrate):
            if stage is not None and stage.timer is not None:
                stage.timer.cancel()
        await self.monitor.stop()
        now = asyncio.get_running_loop().time()
        if self.scaler is not None:
            self.scaler.stop()
        for inst in self.instances.values():
            await inst.stop()
            self.released_at.setdefault(inst.id, now)

    async def wait_idle(self) -> None:
        """Until every submitted request has reached a terminal outcome."""
        await self._idle.wait()

    # ---- requests --------------------------------------------------------------------------
    def submit(self, request: Request, listener: Listener | None = None) -> RequestRecord:
        """Queue ``request``; ``listener`` hears each token it samples (real executors) and
        then one final event, also when it is rejected or fails."""
        if request.id in self.records:
            raise ValueError(f"duplicate request id {request.id!r}")
        record = RequestRecord(request)
        self.records[request.id] = record
        if listener is not None:
            self._listeners[request.id] = listener
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
            self._awaiting[request.id] = record
            self._awaiting_count[p] += 1
        if record.slo is None:
            why = ("a priority needs priority mapping (--priorities N)"
                   if request.priority is not None else "request has no SLO or priority")
            self._finish(record, Outcome.REJECTED, request.arrival, why)
            return record
        if request.slo is None:  # the policy sees the mapped SLO; the record keeps both
            request = replace(request, slo=record.slo)
        if self.scaler is not None:
            self._awaiting[request.id] = record
            self.scaler.on_enqueue(Role.PREFILL if self.pd else Role.COLOCATED,
                                   request.arrival)
        if self.pd:
            self._sent[request.id] = request
        assert self._dispatch is not None, "start() the control plane first"
        self._dispatch.policy.enqueue(request, asyncio.get_running_loop().time())
        self._schedule(self._dispatch)
        return record

    def forget(self, request_id: str) -> RequestRecord | None:
        """Drop a finished request's record (a long-running server would otherwise keep every
        record); returns it, or None if it is unknown or still pending."""
        record = self.records.get(request_id)
        if record is None or record.outcome is Outcome.PENDING:
            return None
        del self.records[request_id]
        self.num_done -= 1
        return record

    def abort(self, request_id: str) -> None:
        """Abort a request wherever it is; each instance holding it reports the abort."""
        record = self.records.get(request_id)
        if record is None or record.outcome is not Outcome.PENDING:
            return
        if record.instance is None:  # still in the dispatch queue: skipped when dispatched
            self._finish(record, Outcome.ABORTED, asyncio.get_running_loop().time())
            return
        self.instances[record.instance].abort(request_id)
        if record.decode_instance is not None:
            self.instances[record.decode_instance].abort(request_id)

    # ---- scheduling ------------------------------------------------------------------------
    def _schedule(self, stage: _Stage) -> None:
        loop = asyncio.get_running_loop()
        stage.view.now = loop.time()
        decision = stage.policy.schedule(stage.view)
        if stage is self._migrate:
            self._apply_migrations(decision, stage.view.now)
        else:
            self._apply(decision, stage.view.now)
        if stage.timer is not None:
            stage.timer.cancel()
            stage.timer = None
        if decision.wake_at is not None:
            stage.timer = loop.call_at(max(decision.wake_at, stage.view.now),
                                       self._schedule, stage)

    def _apply(self, decision: Decision, now: float) -> None:
        for d in decision.dispatch:
            record = self.records[d.request.id]
            if record.outcome is not Outcome.PENDING:
                continue  # aborted while queued
            record.dispatch_time = now
            record.instance = d.instance
            record.best_effort = d.best_effort
            if self.scaler is not None:
                self.scaler.on_dequeue(Role.PREFILL if self.pd else Role.COLOCATED, now)
            try:
                self.instances[d.instance].submit(d.request, d.best_effort)
            except EngineError as e:
                self._finish(record, Outcome.FAILED, now, str(e))
                continue
            self._count(d.instance, d.request, +1)
        for request in decision.reject:
            self._finish(self.records[request.id], Outcome.REJECTED, now, "rejected by policy")

    def _count(self, instance_id: int, request: Request, sign: int) -> None:
        view = self._views[instance_id]
        view.outstanding += sign
        view.outstanding_tokens += sign * (request.prompt_len + request.max_tokens)

    def _on_snapshot(self, snapshot: dict) -> None:
        for iid, stats in snapshot.items():
            view = self._views.get(iid)
            if view is not None:  # an instance between roles has no view for a moment
                view.stats = stats
        for stage in (self._dispatch, self._migrate):
            if stage is not None and stage.policy.num_queued():
                self._schedule(stage)

    # ---- the fleet changes (the Scaler drives these) -------------------------------------------
    @property
    def draining(self) -> frozenset[int]:
        return frozenset(self._draining)

    def accepting(self, instance_id: int) -> bool:
        view = self._views.get(instance_id)
        return view is not None and view.accepting

    def waiting(self, role: Role):
        """(waiting since, SLO) of queued requests: without a first token (colocated, prefill),
        or prefilled and not yet migrated (decode) — the Scaler's W indicator."""
        if role is Role.DECODE:
            yield from self._to_migrate.values()
        else:
            for record in self._awaiting.values():
                yield record.request.arrival, record.slo.ttft

    def _stage_of(self, role: Role) -> _Stage:
        stage = self._migrate if role is Role.DECODE else self._dispatch
        assert stage is not None
        return stage

    def add_instance(self, instance: Instance, provisioned_at: float) -> None:
        """A new instance serves from now on; its cost counts from ``provisioned_at``."""
        if instance.id in self.instances or instance.id in self.retired:
            raise ValueError(f"instance id {instance.id} is taken")
        self.instances[instance.id] = instance
        self.active_since[instance.id] = provisioned_at
        instance.start(self.on_events)
        self._join(instance)

    def _join(self, instance: Instance) -> None:
        stats = instance.stats()
        view = self._views[instance.id] = InstanceView(instance.id, instance.role, stats)
        stage = self._stage_of(instance.role)
        stage.view.instances.append(view)
        if self.pd:  # links to the other pool before it serves (seed 000 §6)
            assert self.tl is not None
            (self.tl.add_prefill if instance.role is Role.PREFILL else self.tl.add_decode)(
                instance.id)
        self.monitor.latest[instance.id] = stats
        if stage.policy.num_queued():
            self._schedule(stage)

    def drain(self, instance_id: int) -> None:
        """Take no new work on this instance; it leaves once it holds nothing."""
        view = self._views[instance_id]
        view.accepting = False
        self._draining.add(instance_id)
        stage = self._stage_of(view.role)
        stage.policy.on_instance_removed(instance_id)
        if stage.policy.num_queued():
            self._schedule(stage)
        self._check_drained(instance_id)

    def _check_drained(self, instance_id: int) -> None:
        if instance_id not in self._draining or self._views[instance_id].outstanding > 0:
            return
        self._draining.discard(instance_id)
        if self.scaler is not None:
            self.scaler.on_drained(instance_id)
        else:
            self.release(instance_id)

    def _leave(self, instance_id: int) -> Instance:
        view = self._views.pop(instance_id)
        stage = self._stage_of(view.role)
        stage.view.instances = [v for v in stage.view.instances if v.id != instance_id]
        if self.tl is not None:
            self.tl.remove(instance_id)
        self.monitor.latest.pop(instance_id, None)
        return self.instances[instance_id]

    def release(self, instance_id: int) -> None:
        """Stop a drained instance; its cost stops counting now."""
        instance = self._leave(instance_id)
        del self.instances[instance_id]
        self.retired[instance_id] = instance
        self.released_at[instance_id] = asyncio.get_running_loop().time()
        asyncio.get_running_loop().create_task(instance.stop())

    def switch_role(self, instance_id: int, role: Role, ready_at: float) -> None:
        """P/D: a drained instance serves the other pool from ``ready_at`` (seed 000 §6)."""
        instance = self._leave(instance_id)
        instance.set_role(role)
        asyncio.get_running_loop().call_at(ready_at, self._join, instance)

    # ---- P/D migration (seed 000 §5.1: the Migrator and the TLManager) -------------------------
    def _apply_migrations(self, decision: Decision, now: float) -> None:
        for d in decision.dispatch:
            record = self.records[d.request.id]
            if record.outcome is not Outcome.PENDING:
                continue
            src, dst = record.instance, d.instance
            assert src is not None and self.tl is not None
            state = self.instances[src].migration_state(d.request.id)
            try:
                reserved = self.instances[dst].reserve_import(state)
            except EngineError as e:
                self.instances[src].abort(d.request.id)
                self._finish(record, Outcome.FAILED, now, str(e))
                continue
            if not reserved:  # no KV free there: wait for a finish, never overcommit
                self._blocked.append(d.request)
                continue
            record.decode_instance = dst
            self._to_migrate.pop(d.request.id, None)
            if self.scaler is not None:
                self.scaler.on_dequeue(Role.DECODE, now)
            self._count(dst, d.request, +1)
            done = self.tl.book(src, dst, state.num_computed_tokens, now)
            asyncio.get_running_loop().call_at(done, self._complete_migration, record)

    def _complete_migration(self, record: RequestRecord) -> None:
        """The KV has arrived: free it on the prefill instance, decode on the decode one."""
        src, dst = record.instance, record.decode_instance
        assert src is not None and dst is not None and self._dispatch is not None
        if record.outcome is not Outcome.PENDING:
            return  # aborted in flight; both instances dropped it
        now = asyncio.get_running_loop().time()
        kv = self.instances[src].export(record.request.id)
        self._count(src, record.request, -1)
        self._check_drained(src)
        record.migrated_at = now
        self._dispatch.policy.on_finished(record, self._dispatch.view)  # it left the P stage
        self.instances[dst].activate_import(record.request.id, kv)
        if self._dispatch.policy.num_queued():
            self._schedule(self._dispatch)

    def _on_prefilled(self, request_id: str, now: float) -> None:
        assert self._migrate is not None
        record = self.records[request_id]
        if record.outcome is Outcome.PENDING:
            request = self._sent[request_id]
            self._migrate.policy.enqueue(request, now)
            if self.scaler is not None:
                self._to_migrate[request_id] = (now, request.slo.tpot)
                self.scaler.on_enqueue(Role.DECODE, now)

    # ---- step outputs ----------------------------------------------------------------------
    def on_events(self, instance_id: int, out: StepOutput) -> None:
        """Sink of every instance's step outputs."""
        if out.error is not None:
            self._on_instance_failed(instance_id, out)
            return
        records = self.records
        now = out.time
        for rid in out.request_ids:
            records[rid].token_times.append(now)
        if out.token_ids is not None:  # a real executor: kept so that a retry can resume
            for rid, token in zip(out.request_ids, out.token_ids, strict=True):
                record = records[rid]
                if record.output_ids is None:
                    record.output_ids = []
                record.output_ids.append(token)
        if self._listeners:
            tokens = out.token_ids or [PLACEHOLDER_TOKEN] * len(out.request_ids)
            for rid, token in zip(out.request_ids, tokens, strict=True):
                listener = self._listeners.get(rid)
                if listener is not None:
                    listener(TokenEvent(token))
        if self._awaiting:
            for rid in out.request_ids:
                self._first_token(rid)
        if not out.transitions:
            return
        prefilled = finished = False
        for rid, status in out.transitions:
            if status is RequestStatus.PREFILLED:
                self._on_prefilled(rid, now)
                prefilled = True
                continue
            record = records[rid]
            self._count(instance_id, record.request, -1)
            self._check_drained(instance_id)
            if record.outcome is not Outcome.PENDING:
                continue  # closed by the other instance of a migration aborted in flight
            outcome = (Outcome.ABORTED if status is RequestStatus.FINISHED_ABORTED
                       else Outcome.FINISHED)
            self._finish(record, outcome, now, reason=FINISH_REASON[status])
            finished = True
        if finished and self._blocked and self._migrate is not None:
            for request in self._blocked:  # decode KV may be free now
                self._migrate.policy.enqueue(request, now)
            self._blocked.clear()
        for stage in (self._dispatch, self._migrate):
            if stage is not None and (finished or prefilled) and stage.policy.num_queued():
                self._schedule(stage)

    # ---- an instance fails (its executor raised, its process died) ---------------------------
    def _on_instance_failed(self, instance_id: int, out: StepOutput) -> None:
        """Take the instance out of service, resume what it held elsewhere where that is safe,
        fail the rest with the reason (never leave a request hanging); the Scaler replaces it.
        ``out.transitions`` lists every request the instance held."""
        now = out.time
        if instance_id not in self._views:
            return  # already gone (released, or between roles)
        role = self._views[instance_id].role
        self.num_instance_failures += 1
        self.drain(instance_id)  # no new work there: retries go elsewhere
        for rid, _ in out.transitions:
            record = self.records[rid]
            self._count(instance_id, record.request, -1)
            if record.outcome is not Outcome.PENDING:
                continue
            dst = record.decode_instance
            if dst is not None and dst != instance_id and dst in self.instances:
                self.instances[dst].abort(rid)  # its KV was on its way there: free the room
            if self._resumable(record, instance_id):
                self._resume(record, now)
            else:
                self._finish(record, Outcome.FAILED, now, out.error)
        self._check_drained(instance_id)
        if self.scaler is not None:
            self.scaler.on_failed(instance_id, role)
        for stage in (self._dispatch, self._migrate):
            if stage is not None and stage.policy.num_queued():
                self._schedule(stage)

    def _resumable(self, record: RequestRecord, instance_id: int) -> bool:
        """Colocated: any request, from its prompt and the tokens it already streamed (greedy
        and seeded sampling continue exactly: seeds are per position). P/D: only one its
        prefill instance lost before its first token; later ones are in the Migrator's hands."""
        if record.retries >= self.max_retries:
            return False
        if record.request.prompt_token_ids is not None and record.num_tokens and (
                record.output_ids is None or len(record.output_ids) != record.num_tokens):
            return False  # a real model needs the tokens it produced
        if self.pd:
            return record.num_tokens == 0 and record.instance == instance_id
        return True

    def _resume(self, record: RequestRecord, now: float) -> None:
        """Queue the rest of the request as a new placement; the record keeps its token times
        and its listener, so the client's stream just goes on."""
        assert self._dispatch is not None
        req, n = record.request, record.num_tokens
        if n >= req.max_tokens:  # every token arrived; only the finish was lost
            self._finish(record, Outcome.FINISHED, now, reason="length")
            return
        ids = (None if req.prompt_token_ids is None
               else req.prompt_token_ids + (record.output_ids or []))
        rest = replace(req, slo=record.slo, prompt_len=req.prompt_len + n,
                       prompt_token_ids=ids, max_tokens=req.max_tokens - n)
        stage = self._dispatch
        stage.policy.on_finished(record, stage.view)  # it left the instance it was on
        record.instance = None
        record.retries += 1
        self.num_resumed += 1
        if self.pd:
            self._sent[req.id] = rest
        stage.policy.enqueue(rest, now)

    def _first_token(self, request_id: str) -> None:
        record = self._awaiting.pop(request_id, None)
        if record is not None and self._awaiting_count and record.request.priority is not None:
            self._awaiting_count[record.request.priority] -= 1

    def _finish(self, record: RequestRecord, outcome: Outcome, now: float,
                error: str | None = None, reason: str | None = None) -> None:
        record.outcome = outcome
        record.finish_time = now
        record.error = error
        self.num_done += 1
        req = record.request
        self._sent.pop(req.id, None)
        self._to_migrate.pop(req.id, None)
        if self._awaiting:
            self._first_token(req.id)
        if (self.mapper is not None and req.priority is not None and outcome is Outcome.FINISHED
                and record.queue_time is not None and 0 <= req.priority < self.mapper.levels):
            self.mapper.observe(req.priority, record.ttft, record.queue_time, record.tpot)
        last = self._migrate if self._migrate is not None and record.decode_instance is not None \
            else self._dispatch
        if last is not None:
            last.policy.on_finished(record, last.view)
        if self.num_done == len(self.records):
            self._idle.set()
        if self._listeners:  # last: a listener may forget() the record
            listener = self._listeners.pop(record.request.id, None)
            if listener is not None:
                if reason is None:
                    reason = "abort" if outcome is Outcome.ABORTED else "error"
                listener(TokenEvent(None, reason, error))
