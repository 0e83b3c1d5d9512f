# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The fleet: which instances serve, in which role, what each holds, and what each costs.

Membership (the initial fleet, an instance joining, draining, leaving, switching role in P/D),
the views the policies see (the Monitor's latest snapshot plus the control plane's own
outstanding-work tallies), the KV links between the P/D pools (TLManager, HyperFlexis §6), and each
instance's lifetime for cost (HyperFlexis Eq. 3). The Scaler changes the fleet through these
methods; the control plane routes requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from hfx.cluster.instance import EventSink, Instance
from hfx.cluster.monitor import Monitor
from hfx.cluster.stage import Stage
from hfx.cluster.tl_manager import TLManager
from hfx.engine.sequence import Role
from hfx.engine.stats import InstanceStats
from hfx.policies.base import InstanceView
from hfx.policies.prefix_index import EVENTS, PrefixIndex
from hfx.request import Request


class Fleet:
    def __init__(self, instances: Iterable[Instance], monitor: Monitor,
                 tl_manager: TLManager | None = None, prefix: PrefixIndex | None = None) -> None:
        self.instances: dict[int, Instance] = {inst.id: inst for inst in instances}
        if not self.instances:
            raise ValueError("a cluster needs at least one instance")
        roles = {inst.role for inst in self.instances.values()}
        self.pd = Role.PREFILL in roles or Role.DECODE in roles
        if self.pd and (roles != {Role.PREFILL, Role.DECODE} or tl_manager is None):
            raise ValueError("P/D needs prefill and decode instances, a migrator and a "
                             "TLManager; colocated instances cannot mix with them")
        self.monitor = monitor
        self.tl = tl_manager
        self.retired: dict[int, Instance] = {}  # released instances, kept for the record
        # Instance lifetimes on the loop's clock, for cost (HyperFlexis Eq. 3).
        self.active_since: dict[int, float] = {}
        self.released_at: dict[int, float] = {}
        self.views: dict[int, InstanceView] = {}
        self.stages: dict[Role, Stage] = {}  # the stage each role's instances serve
        self.on_drained: Callable[[int], None] = self.release  # the Scaler may decide instead
        self._draining: set[int] = set()
        self._ejected: set[int] = set()  # taking no new work for a while (outliers.py)
        self._sink: EventSink | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self.prefix = prefix  # what each instance's prefix cache holds (prefix_index.py)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, sink: EventSink, now: float) -> None:
        """Start every instance; take the first snapshot; link the P/D pools."""
        self._sink = sink
        for inst in self.instances.values():
            inst.start(sink)
            self.active_since[inst.id] = now
        snapshot = self.monitor.collect(self.instances.values())
        self.views = {i: InstanceView(i, s.role, s) for i, s in snapshot.items()}
        for inst in self.instances.values():
            self._index(inst, snapshot[inst.id])
        if self.tl is not None:  # links before anyone serves (HyperFlexis §6)
            for v in self.views.values():
                (self.tl.add_prefill if v.role is Role.PREFILL else self.tl.add_decode)(v.id)

    def members_view(self, role: Role | None) -> list[InstanceView]:
        """The views of one role's instances (all of them for ``None``)."""
        return [v for v in self.views.values() if role is None or v.role is role]

    async def stop(self) -> None:
        now = asyncio.get_running_loop().time()
        for inst in self.instances.values():
            await inst.stop()
            self.released_at.setdefault(inst.id, now)

    def on_snapshot(self, snapshot: dict[int, InstanceStats]) -> None:
        for iid, stats in snapshot.items():
            view = self.views.get(iid)
            if view is not None:  # an instance between roles has no view for a moment
                view.stats = stats
        self._changed()

    def _changed(self) -> None:
        """Tell every stage's view that snapshots, acceptance or membership moved."""
        for stage in self.stages.values():
            stage.view.changed()

    # ---- outstanding work ------------------------------------------------------------------
    def count(self, instance_id: int, request: Request, sign: int) -> None:
        """A request was placed on (+1) or left (-1) an instance."""
        view = self.views[instance_id]
        view.outstanding += sign
        view.outstanding_tokens += sign * (request.prompt_len + request.max_tokens)

    # ---- membership ------------------------------------------------------------------------
    @property
    def draining(self) -> frozenset[int]:
        return frozenset(self._draining)

    @property
    def ejected(self) -> frozenset[int]:
        return frozenset(self._ejected)

    def accepting(self, instance_id: int) -> bool:
        view = self.views.get(instance_id)
        return view is not None and view.accepting

    def role_of(self, instance_id: int) -> Role | None:
        """The role of a serving instance; None if it has left (or is between roles)."""
        view = self.views.get(instance_id)
        return None if view is None else view.role

    def add_instance(self, instance: Instance, provisioned_at: float) -> None:
        """A new instance serves from now on; its cost counts from ``provisioned_at``."""
        if instance.id in self.instances or instance.id in self.retired:
            raise ValueError(f"instance id {instance.id} is taken")
        assert self._sink is not None, "start() the fleet first"
        self.instances[instance.id] = instance
        self.active_since[instance.id] = provisioned_at
        instance.start(self._sink)
        self.join(instance)

    def _index(self, instance: Instance, stats: InstanceStats) -> None:
        """Feed the prefix index from the instance's own engine where it runs here, else from
        what is routed to it."""
        prefix = self.prefix
        if prefix is None:
            return
        if not prefix.sources:
            # Keyed at the engines' block size, which only they know (vLLM's CPU build runs 32
            # where 16 is asked).
            prefix.block_size = stats.block_size
        kv = getattr(getattr(instance, "engine", None), "kv", None)
        if kv is None:
            # A vLLM server that publishes its KV events says what it holds; else estimate.
            iid, blocks = instance.id, stats.kv_total_blocks
            watch = getattr(instance, "watch_cache", None)
            if watch is None or not watch(prefix.watch(iid, EVENTS),
                                          lambda: prefix.fall_back(iid, blocks)):
                prefix.estimate(iid, blocks)
            return
        feed = kv.listener = prefix.watch(instance.id)
        for key in kv.cached_keys():  # a role switch's engine comes back with its cache
            feed.stored(key)

    def join(self, instance: Instance) -> None:
        stats = instance.stats()
        self._index(instance, stats)
        view = self.views[instance.id] = InstanceView(instance.id, instance.role, stats)
        stage = self.stages[instance.role]
        stage.view.instances.append(view)
        stage.view.changed()
        if self.tl is not None:  # links to the other pool before it serves (HyperFlexis §6)
            (self.tl.add_prefill if instance.role is Role.PREFILL else self.tl.add_decode)(
                instance.id)
        self.monitor.latest[instance.id] = stats
        stage.schedule_if_queued()

    def drain(self, instance_id: int) -> None:
        """Take no new work on this instance; it leaves once it holds nothing."""
        self._draining.add(instance_id)
        self._ejected.discard(instance_id)
        self._stop_taking(instance_id)
        self.check_drained(instance_id)

    def eject(self, instance_id: int) -> None:
        """Take no new work on this instance for now; what it runs goes on (outliers.py)."""
        self._ejected.add(instance_id)
        self._stop_taking(instance_id)

    def readmit(self, instance_id: int) -> None:
        """An ejected instance takes work again (unless it drains meanwhile)."""
        view = self.views.get(instance_id)
        if instance_id not in self._ejected or view is None:
            return
        self._ejected.discard(instance_id)
        view.accepting = True
        self._changed()
        self.stages[view.role].schedule_if_queued()

    def _stop_taking(self, instance_id: int) -> None:
        view = self.views[instance_id]
        view.accepting = False
        self._changed()
        stage = self.stages[view.role]
        stage.policy.on_instance_removed(instance_id)  # what it queued for it goes elsewhere
        stage.schedule_if_queued()

    def check_drained(self, instance_id: int) -> None:
        if instance_id not in self._draining or self.views[instance_id].outstanding > 0:
            return
        self._draining.discard(instance_id)
        self.on_drained(instance_id)

    def _leave(self, instance_id: int) -> Instance:
        self._ejected.discard(instance_id)
        view = self.views.pop(instance_id)
        stage = self.stages[view.role]
        stage.view.instances = [v for v in stage.view.instances if v.id != instance_id]
        stage.view.changed()
        if self.tl is not None:
            self.tl.remove(instance_id)
        self.monitor.latest.pop(instance_id, None)
        instance = self.instances[instance_id]
        if self.prefix is not None:
            self.prefix.drop(instance_id)
            kv = getattr(getattr(instance, "engine", None), "kv", None)
            if kv is not None:
                kv.listener = None
        return instance

    def release(self, instance_id: int) -> None:
        """Stop a drained instance; its cost stops counting now."""
        instance = self._leave(instance_id)
        del self.instances[instance_id]
        self.retired[instance_id] = instance
        loop = asyncio.get_running_loop()
        self.released_at[instance_id] = loop.time()
        task = loop.create_task(instance.stop())
        self._stopping.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._stopping.discard)

    def switch_role(self, instance_id: int, role: Role, ready_at: float) -> None:
        """P/D: a drained instance serves the other pool from ``ready_at`` (HyperFlexis §6)."""
        instance = self._leave(instance_id)
        instance.set_role(role)
        asyncio.get_running_loop().call_at(ready_at, self.join, instance)

    def record_span(self, instance_id: int, since: float, until: float) -> None:
        """Cost of an instance that never served (the run ended while it loaded)."""
        self.active_since[instance_id] = since
        self.released_at[instance_id] = until

    def spans(self) -> list[tuple[float, float]]:
        """(provisioned, released) of every instance the run had, for cost (seed Eq. 3)."""
        return [(self.active_since[i], self.released_at[i]) for i in self.active_since]
