"""P/D migration (HyperFlexis §5.1): the Migrator's stage and the KV moves it decides.

A prefill instance reports each request it prefilled (status PREFILLED: first token sampled, KV
held). The Migrator, a policy over the decode instances, picks where it decodes. A migration
then (a) reserves blocks for the KV on the decode instance, or waits for a decode request to
finish rather than overcommit; (b) books the transfer on the TLManager's link; (c) when it
completes, frees the KV on the prefill instance and (d) starts decoding on the decode instance.
The KV is on the decode instance exactly once; nothing decodes on two instances.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from hfx.cluster.fleet import Fleet
from hfx.cluster.ledger import RequestLedger
from hfx.cluster.stage import Stage
from hfx.cluster.tl_manager import TLManager
from hfx.engine import EngineError, Role
from hfx.policies import ClusterView, Decision, Policy
from hfx.request import Outcome, Request, RequestRecord

Fail = Callable[[RequestRecord, Outcome, float, str], None]


class Migration:
    def __init__(self, migrator: Policy, fleet: Fleet, ledger: RequestLedger, tl: TLManager,
                 dispatch: Stage, fail: Fail) -> None:
        self.fleet = fleet
        self.ledger = ledger
        self.tl = tl
        self.dispatch = dispatch  # the P stage: it learns when a request leaves its instance
        self._fail = fail
        view = ClusterView(dispatch.view.now, fleet.members_view(Role.DECODE),
                           dispatch.view.step_model, dispatch.view.profile,
                           mixed_steps=dispatch.view.mixed_steps)  # (no Migrator reads it yet)
        self.stage = Stage("migrate", migrator, view, self._apply)
        self.sent: dict[str, Request] = {}  # each request as the policies see it
        self.blocked: list[Request] = []  # migrations waiting for decode KV
        # Prefilled and not yet placed (in the Migrator's queue or blocked): (prefilled at,
        # TPOT), the Scaler's W indicator; enqueues and dequeues reported when a Scaler listens.
        self.queued: dict[str, tuple[float, float]] = {}
        self.on_enqueue: Callable[[float], None] | None = None
        self.on_dequeue: Callable[[float], None] | None = None

    def waiting(self) -> Iterator[tuple[float, float]]:
        yield from self.queued.values()

    def forget(self, request_id: str) -> None:
        """``request_id`` ended (finished, aborted, failed). One still waiting for a decode
        instance leaves the Migrator's queue now: a Migrator that placed it later would count
        it in its shadow of that instance, where it never arrives and never finishes (a few
        client aborts once filled a decode instance's shadow and stalled the stage)."""
        self.sent.pop(request_id, None)
        if self.queued.pop(request_id, None) is not None:
            self.stage.policy.withdraw(request_id)
            self.blocked = [r for r in self.blocked if r.id != request_id]

    def on_prefilled(self, request_id: str, now: float) -> None:
        """A prefill instance holds ``request_id``'s KV: the Migrator places it."""
        record = self.ledger.records[request_id]
        if record.outcome is Outcome.PENDING:
            request = self.sent[request_id]
            assert request.slo is not None  # P/D requests carry one (submit rejects the rest)
            self.queued[request_id] = (now, request.slo.tpot)
            self.stage.enqueue(request, now)
            if self.on_enqueue is not None:
                self.on_enqueue(now)

    def on_finished(self, now: float) -> None:
        """A decode request finished: migrations that waited for its KV may go now."""
        if self.blocked:
            for request in self.blocked:
                self.stage.enqueue(request, now)
            self.blocked.clear()

    def _apply(self, decision: Decision, now: float) -> None:
        fleet = self.fleet
        for d in decision.dispatch:
            record = self.ledger.records[d.request.id]
            if record.outcome is not Outcome.PENDING:
                continue
            src, dst = record.instance, d.instance
            assert src is not None
            state = fleet.instances[src].migration_state(d.request.id)
            try:
                reserved = fleet.instances[dst].reserve_import(state)
            except EngineError as e:
                fleet.instances[src].abort(d.request.id)
                self._fail(record, Outcome.FAILED, now, str(e))
                continue
            if not reserved:  # no KV free there: wait for a finish, never overcommit
                self.blocked.append(d.request)
                self.stage.policy.on_unplaced(d.request, dst)
                continue
            record.decode_instance = dst
            self.queued.pop(d.request.id, None)
            if self.on_dequeue is not None:
                self.on_dequeue(now)
            fleet.count(dst, d.request, +1)
            done = self.tl.book(src, dst, state.num_computed_tokens, now)
            asyncio.get_running_loop().call_at(done, self._complete, record)

    def _complete(self, record: RequestRecord) -> None:
        """The KV has arrived: free it on the prefill instance, decode on the decode one."""
        src, dst = record.instance, record.decode_instance
        assert src is not None and dst is not None
        if record.outcome is not Outcome.PENDING:
            return  # aborted in flight; both instances dropped it
        now = asyncio.get_running_loop().time()
        fleet = self.fleet
        kv = fleet.instances[src].export(record.request.id)
        fleet.count(src, record.request, -1)
        fleet.check_drained(src)
        record.migrated_at = now
        self.dispatch.policy.on_finished(record, self.dispatch.view)  # it left the P stage
        fleet.instances[dst].activate_import(record.request.id, kv)
        self.dispatch.schedule_if_queued()
