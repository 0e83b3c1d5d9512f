"""Instances as Ray actors: the same Instance protocol, an engine in another process.

``EngineActor`` runs a ``LocalInstance`` on the actor's own event loop, anywhere in the Ray
cluster. ``RayInstance`` is its proxy on the control plane's loop:

- requests go out fire-and-forget; the proxy first runs the engine's own admission check
  (``Admission``, fetched once), so a request the engine would refuse is refused here, at once;
- step outputs come back by long poll: one ``poll`` call in flight at a time, answered as soon as
  the engine has produced anything (or after ``POLL_SECONDS`` with a fresh stats snapshot), so a
  token costs one actor round trip, and ``stats()`` is never older than the last answer;
- the actor's clock is not ours (another host's monotonic clock): the offset is measured at
  connection (midpoint of the fastest of a few round trips) and every time crossing is shifted;
- a dead actor (process killed, node lost) surfaces as ``RayActorError`` on the poll: the proxy
  reports every request it held as failed, exactly like an executor that raised, and the control
  plane resumes them elsewhere or fails them with the reason.

P/D migration (HyperFlexis §5.1) keeps the control plane synchronous: a prefill actor sends each
prefilled request's migration state with the PREFILLED event; a decode proxy answers
``reserve_import`` from the latest stats less what it reserved since (the engine's own rule,
all-or-nothing with the watermark), and should the actor find the blocks taken after all, the
import waits there until they free — the KV is never overcommitted. ``export`` returns the
prefill actor's KV as an ObjectRef that the decode actor resolves itself: the KV goes from
actor to actor through Ray's object store, never through the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import time
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayActorError

from hfx.backends.local import LocalInstance
from hfx.cluster.instance import EventSink, Instance
from hfx.cluster.placement import EngineFactory, WeightLoadingFactory
from hfx.cluster.provisioner import Plan
from hfx.engine import Admission, EngineConfig, RequestStatus, Role, Sequence, StepOutput
from hfx.engine.stats import InstanceStats
from hfx.request import Request
from hfx.sim.clock import cancel

POLL_SECONDS = 0.25  # longest wait for a poll without events: how stale stats() may get
CLOCK_PINGS = 5  # round trips at connection; the fastest one sets the clock offset


class EngineActor:
    """The actor's side: one engine on the actor's event loop (Ray runs async actors on one)."""

    def __init__(self, instance_id: int, make_engine: EngineFactory,
                 config: EngineConfig) -> None:
        self.instance = LocalInstance(instance_id, make_engine(config))
        self._outbox: list[StepOutput] = []
        self._states: dict[str, Sequence] = {}  # prefill role: migration states to send
        # Decode role: imports whose blocks were taken when they came: state, KV arrived, KV.
        self._pending: dict[str, tuple[Sequence, bool, object | None]] = {}
        self._ready = asyncio.Event()
        self._started = False
        self._weights: Any = None  # a WeightManager once a peer asked for the weights

    def _push(self, _: int, out: StepOutput) -> None:
        for rid, status in out.transitions:
            if status is RequestStatus.PREFILLED:
                self._states[rid] = self.instance.migration_state(rid)
        self._outbox.append(out)
        self._ready.set()
        if self._pending and out.transitions:  # blocks may have been freed
            self._retry_imports()

    def _retry_imports(self) -> None:
        for rid, (state, arrived, kv) in list(self._pending.items()):
            if self.instance.reserve_import(state):
                del self._pending[rid]
                if arrived:
                    self.instance.activate_import(rid, kv)

    async def hello(self) -> tuple[Admission, InstanceStats]:
        """Start the engine task (the loop runs by now); the engine's limits, first stats."""
        if not self._started:
            self.instance.start(self._push)
            self._started = True
        return self.instance.engine.admission, self.instance.stats()

    async def clock(self) -> float:
        return asyncio.get_running_loop().time()

    async def share_weights(self) -> Any:
        """Publish this engine's weights for a new instance to copy (the d2d path, HyperFlexis §6):
        a WeightHandle, or None for an engine without real weights."""
        model = getattr(self.instance.engine.executor, "model", None)
        if model is None:
            return None
        if self._weights is None:
            from hfx.model.weight_manager import WeightManager

            self._weights = WeightManager(model)
        return self._weights.share()

    async def where(self) -> dict[str, Any]:
        """The actor's process and node, for operators (and for tests that kill it)."""
        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": ctx.get_node_id()}

    async def poll(self, timeout: float
                   ) -> tuple[list[StepOutput], InstanceStats, dict[str, Sequence]]:
        if not self._outbox:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout)
        self._ready.clear()
        events, self._outbox = self._outbox, []
        states, self._states = self._states, {}
        return events, self.instance.stats(), states

    async def submit(self, request: Request, best_effort: bool) -> None:
        try:
            self.instance.submit(request, best_effort)
        except Exception as e:  # the proxy checked admission: this engine is out of step
            now = asyncio.get_running_loop().time()
            self._push(0, StepOutput(now, [], None,
                                     [(request.id, RequestStatus.FINISHED_ABORTED)],
                                     f"instance {self.instance.id} refused {request.id}: {e}"))

    async def abort(self, request_id: str) -> None:
        if self._pending.pop(request_id, None) is not None:  # never reached the engine
            now = asyncio.get_running_loop().time()
            self._push(0, StepOutput(now, [], None,
                                     [(request_id, RequestStatus.FINISHED_ABORTED)]))
            return
        self.instance.abort(request_id)

    async def export(self, request_id: str) -> object | None:
        return self.instance.export(request_id)

    async def reserve_import(self, state: Sequence) -> None:
        if not self.instance.reserve_import(state):
            self._pending[state.request_id] = (state, False, None)

    async def activate_import(self, request_id: str, kv: object | None) -> None:
        pending = self._pending.get(request_id)
        if pending is not None:  # activated once its blocks are reserved
            self._pending[request_id] = (pending[0], True, kv)
        else:
            self.instance.activate_import(request_id, kv)

    async def set_role(self, role: Role) -> None:
        self.instance.set_role(role)

    async def stop(self) -> None:
        await self.instance.stop()


class RayInstance:
    """The control plane's handle on an EngineActor."""

    def __init__(self, instance_id: int, actor: Any, config: EngineConfig, admission: Admission,
                 stats: InstanceStats, offset: float) -> None:
        self.id = instance_id
        self.role = config.role
        self.config = config
        self.actor = actor
        self.admission = admission
        self.offset = offset  # our clock minus the actor's
        self._stats = self._ours(stats)
        self._held: set[str] = set()  # requests sent and not yet ended there
        self._states: dict[str, Sequence] = {}  # prefill role: migration states, our clock
        self._reserved = 0  # decode role: blocks reserved since the latest stats
        self._sink: EventSink | None = None
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def launch(cls, instance_id: int, make_engine: EngineFactory, config: EngineConfig,
                     **actor_options: Any) -> RayInstance:
        """Create the actor (``actor_options``: num_cpus, num_gpus, ... for Ray's placement),
        wait until its engine is built, measure its clock; the loop serves meanwhile."""
        actor = _create(instance_id, make_engine, config, actor_options)
        try:
            admission, stats = await actor.hello.remote()
            loop = asyncio.get_running_loop()
            samples = []
            for _ in range(CLOCK_PINGS):
                sent = loop.time()
                theirs = await actor.clock.remote()
                samples.append((sent, theirs, loop.time()))
        except BaseException:  # cancelled, or the engine failed to build: no orphan actor
            ray.kill(actor, no_restart=True)
            raise
        return cls(instance_id, actor, config, admission, stats, _offset(samples))

    @classmethod
    def connect(cls, instance_id: int, actor: Any, config: EngineConfig) -> RayInstance:
        """``launch`` for code that is not on a loop yet (the fleet at start): blocks. Our
        clock is then time.monotonic(), which is what the asyncio loop's time() reads."""
        try:
            admission, stats = ray.get(actor.hello.remote())
            samples = []
            for _ in range(CLOCK_PINGS):
                sent = time.monotonic()
                theirs = ray.get(actor.clock.remote())
                samples.append((sent, theirs, time.monotonic()))
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        return cls(instance_id, actor, config, admission, stats, _offset(samples))

    # ---- the Instance protocol --------------------------------------------------------------
    def start(self, sink: EventSink) -> None:
        self._sink = sink
        self._pump = asyncio.get_running_loop().create_task(self._poll(),
                                                            name=f"ray-instance-{self.id}")

    async def stop(self) -> None:
        await cancel(self._pump)
        self._pump = None
        ray.kill(self.actor, no_restart=True)

    def check(self, request: Request) -> None:
        self.admission.check_size(request.prompt_len, request.max_tokens)

    def submit(self, request: Request, best_effort: bool = False) -> None:
        self.admission.check(request.id, request.prompt_len, request.max_tokens,
                             request.prompt_token_ids)
        self._held.add(request.id)
        self.actor.submit.remote(replace(request, arrival=request.arrival - self.offset),
                                 best_effort)

    def abort(self, request_id: str) -> None:
        if request_id in self._held:
            self.actor.abort.remote(request_id)

    def migration_state(self, request_id: str) -> Sequence:
        return self._states[request_id]

    def reserve_import(self, state: Sequence) -> bool:
        """The engine's rule on the latest stats less our reservations since (see above)."""
        st = self._stats
        self.admission.check_size(state.prompt_len, state.max_tokens)
        needed = self.admission.blocks_for(state.num_tokens)
        free = st.kv_total_blocks - st.kv_used_blocks - self._reserved
        if needed > free - self.config.watermark_blocks:
            return False
        self._reserved += needed
        self._held.add(state.request_id)
        theirs = copy.copy(state)
        if theirs.prefill_deadline is not None:
            theirs.prefill_deadline -= self.offset
        self.actor.reserve_import.remote(theirs)
        return True

    def export(self, request_id: str) -> object | None:
        """An ObjectRef to the KV; the decode actor fetches it from the object store."""
        self._states.pop(request_id, None)
        self._held.discard(request_id)
        return self.actor.export.remote(request_id)

    def activate_import(self, request_id: str, kv: object | None = None) -> None:
        self.actor.activate_import.remote(request_id, kv)

    def set_role(self, role: Role) -> None:
        self.actor.set_role.remote(role)
        self.role = role

    def stats(self) -> InstanceStats:
        return self._stats

    # ---- events back ------------------------------------------------------------------------
    def _ours(self, stats: InstanceStats) -> InstanceStats:
        return replace(stats, time=stats.time + self.offset)

    async def _poll(self) -> None:
        sink = self._sink
        assert sink is not None
        while True:
            try:
                events, stats, states = await self.actor.poll.remote(POLL_SECONDS)
            except RayActorError as e:
                self._died(f"instance {self.id} (Ray actor) died: {_first_line(e)}")
                return
            self._stats = self._ours(stats)
            self._reserved = 0
            for rid, state in states.items():
                if state.prefill_deadline is not None:
                    state.prefill_deadline += self.offset
                self._states[rid] = state
            for out in events:
                for rid, status in out.transitions:
                    if status is not RequestStatus.PREFILLED:
                        self._held.discard(rid)
                sink(self.id, out.at(out.time + self.offset, out.earlier_ticks))

    def _died(self, error: str) -> None:
        assert self._sink is not None
        now = asyncio.get_running_loop().time()
        held, self._held = self._held, set()
        self._sink(self.id, StepOutput(now, [], None, [
            (rid, RequestStatus.FINISHED_ABORTED) for rid in sorted(held)], error))


def _create(instance_id: int, make_engine: EngineFactory, config: EngineConfig,
            options: dict[str, Any]) -> Any:
    return ray.remote(EngineActor).options(**options).remote(instance_id, make_engine, config)


def _offset(samples: list[tuple[float, float, float]]) -> float:
    """Our clock minus the actor's from (sent, their reading, back) round trips: the fastest
    one, read as taken halfway (NTP's rule)."""
    sent, theirs, back = min(samples, key=lambda s: s[2] - s[0])
    return (sent + back) / 2 - theirs


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


class RayPlacement:
    """Every instance a Ray actor, placed by Ray on any node with the resources asked for."""

    def __init__(self, make_engine: EngineFactory, **actor_options: Any) -> None:
        self.make_engine = make_engine  # pickled to each actor, which builds its own engine
        self.actor_options = actor_options
        self._actors: dict[int, Any] = {}  # every actor started, for weights to copy from

    def initial(self, configs: list[tuple[int, EngineConfig]]) -> list[Instance]:
        """Start the fleet's actors together (their engines build in parallel); blocks."""
        actors = [_create(iid, self.make_engine, cfg, self.actor_options) for iid, cfg in configs]
        try:
            fleet: list[Instance] = [RayInstance.connect(iid, actor, cfg)
                                     for (iid, cfg), actor in zip(configs, actors, strict=True)]
            self._actors.update((iid, actor) for (iid, _), actor in zip(configs, actors,
                                                                         strict=True))
            return fleet
        except BaseException:  # all or nothing: no actor left for a fleet that did not start
            for actor in actors:
                ray.kill(actor, no_restart=True)
            raise

    def describe_launch(self, plan: Plan) -> str:
        return plan.describe()

    async def launch(self, instance_id: int, config: EngineConfig, plan: Plan) -> RayInstance:
        make = self.make_engine
        if isinstance(make, WeightLoadingFactory) and make.holds_weights:
            peer = await self._peer_weights() if plan.path == "d2d" else None
            make = make.loading(plan.path, peer)
        instance = await RayInstance.launch(instance_id, make, config, **self.actor_options)
        self._actors[instance_id] = instance.actor
        return instance

    async def _peer_weights(self) -> Any:
        """A running actor's published weights (d2d), or None: then the new one reads disk."""
        for iid, actor in list(self._actors.items()):
            try:
                return await actor.share_weights.remote()
            except Exception:  # a dead actor is no source: try the next
                self._actors.pop(iid, None)
        return None
