# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The local backend: engines driven by tasks on this process's event loop — the simulator's
(``SimExecutor``) and the own PyTorch engine's (``TorchExecutor``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

from hfx.cluster.instance import EventSink, Instance
from hfx.cluster.placement import EngineFactory, WeightLoadingFactory
from hfx.cluster.provisioner import Plan
from hfx.engine.config import EngineConfig
from hfx.engine.core import EngineCore, PlannedStep, StepOutput
from hfx.engine.decode_run import DecodeRun
from hfx.engine.errors import StepFailed
from hfx.engine.executor import steps_are_waits
from hfx.engine.sequence import RequestStatus, Role, Sequence
from hfx.engine.stats import InstanceStats
from hfx.request import Request
from hfx.sim.clock import cancel

# A step that raises with one request in it fails that request alone, unless the steps before
# it raised too: then the executor, not a request, is what is broken.
MAX_FAILED_STEPS_IN_A_ROW = 1


class LocalInstance:
    """An EngineCore driven on the current loop. ``delivery`` delays every output that long on
    its way to the sink: a simulated fleet's stand-in for what a real server's front end,
    stream and loop add between a step and the control plane's record of its tokens (fitted
    live by hfx/serving/calibrator.py; 0 for a real engine, which has its own).

    Two drivers of one step loop (the engine core's ``begin_step`` / ``end_step``). A real
    executor's step is awaited by a task (``_run``). A step that is only a wait
    (``steps_are_waits``: the simulator's) is driven by loop timers (``_cycle``): the step ends
    in its timer's callback, with no future, task wake-up or coroutine chain per step (~3 µs
    of the virtual loop's ~4 µs a step; docs/performance.md). Both give the same run
    (tests/test_engine_runs.py), except that the timer driver ends a step one callback earlier,
    which orders it differently against another timer due at the very same instant. ``timers``
    forces either driver."""

    def __init__(self, instance_id: int, engine: EngineCore, delivery: float = 0.0,
                 timers: bool | None = None) -> None:
        self.id = instance_id
        self.engine = engine
        self.delivery = delivery
        self.role = engine.config.role
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sink: EventSink | None = None
        self._timed = steps_are_waits(engine.executor) if timers is None else timers
        # The timer driver's state: its next callback, whether it waits for work (no step in
        # flight, none scheduled), whether it has stopped for good (stopped, or failed).
        self._handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting = False
        self._ended = False
        self._failures_in_a_row = 0

    def start(self, sink: EventSink) -> None:
        self._sink = sink
        loop = self._loop = asyncio.get_running_loop()
        if self._timed:
            self._handle = loop.call_soon(self._cycle)  # where the task's first step would run
        else:
            self._task = loop.create_task(self._run(), name=f"instance-{self.id}")

    async def stop(self) -> None:
        self._flush_run()
        self._ended = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        await cancel(self._task)
        self._task = None

    def _kick(self) -> None:
        """Something may have given the engine work: wake its driver if it waits."""
        if not self._timed:
            self._wake.set()
        elif self._waiting and not self._ended:
            assert self._loop is not None  # waiting: started
            self._waiting = False
            self._handle = self._loop.call_soon(self._cycle)

    def _flush_run(self) -> None:
        """A decode run under way reports the steps it has taken by now, those whose outputs
        stepping would have delivered: the records then read as stepping leaves them."""
        out = self.engine.flush_run()
        if out is None or self._sink is None:
            return
        d = self.delivery
        if d:
            now = asyncio.get_running_loop().time()
            ticks = [t + d for t in [*(out.earlier_ticks or ()), out.time] if t + d <= now]
            if not ticks:
                return  # still on their way
            out = out.at(ticks[-1], ticks[:-1] or None)
        self._sink(self.id, out)

    def check(self, request: Request) -> None:
        self.engine.check(request.prompt_len, request.max_tokens)

    def submit(self, request: Request, best_effort: bool = False) -> None:
        slo = request.slo
        self.engine.add_request(Sequence(
            request_id=request.id,
            prompt_len=request.prompt_len,
            max_tokens=request.max_tokens,
            prompt_token_ids=request.prompt_token_ids,
            stop_token_ids=request.stop_token_ids,
            sampling=request.sampling,
            tpot=slo.tpot if slo else None,
            prefill_deadline=request.arrival + slo.ttft if slo else None,
            best_effort=best_effort,
            block_hashes=request.block_hashes,
            hash_block=request.hash_block,
        ))
        self._kick()

    def abort(self, request_id: str) -> None:
        if self.engine.abort(request_id):
            self._kick()

    # ---- P/D migration (HyperFlexis §5.1): the TLManager drives these ---------------------------
    def migration_state(self, request_id: str) -> Sequence:
        """Prefill role: the held sequence's progress, to reserve room for it elsewhere."""
        return self.engine.held[request_id].migrated_copy()

    def reserve_import(self, state: Sequence) -> bool:
        """Decode role: room for the KV on its way here; False if the blocks are not free."""
        return self.engine.reserve_import(state)

    def export(self, request_id: str) -> object | None:
        """Prefill role: copy the KV out and free it here."""
        kv = self.engine.export_kv(request_id)
        self.engine.release(request_id)
        self._kick()  # freed blocks may admit waiting prefills
        return kv

    def activate_import(self, request_id: str, kv: object | None = None) -> None:
        """Decode role: the KV has arrived; decode it."""
        self.engine.activate_import(request_id, kv)
        self._kick()

    def set_role(self, role: Role) -> None:
        """Switch a drained (empty) instance between prefill and decode (HyperFlexis §6)."""
        if self.engine.has_work() or self.engine.held or self.engine.incoming:
            raise RuntimeError(f"instance {self.id} still holds requests; drain it first")
        self.engine.config.role = role
        self.role = role

    def stats(self) -> InstanceStats:
        e = self.engine
        e.catch_up()  # a decode run under way: its steps so far
        return InstanceStats(
            instance_id=self.id,
            role=self.role,
            time=asyncio.get_running_loop().time(),
            num_waiting=e.num_waiting,
            num_running=e.num_running,
            num_held=len(e.held),
            kv_used_blocks=e.kv.num_used_blocks,
            kv_waiting_blocks=e.state.waiting.blocks,
            kv_total_blocks=e.kv.num_blocks,
            block_size=e.kv.block_size,
            decode_ctx=e.decode_ctx,
            max_num_seqs=e.config.max_num_seqs,
            busy_time=e.busy_time,
            num_steps=e.num_steps,
            prefix_queried_tokens=e.kv.queried_tokens,
            prefix_hit_tokens=e.kv.hit_tokens,
            kv_cached_blocks=e.kv.evictable_blocks,
        )

    def _emit(self, out: StepOutput) -> None:
        assert self._sink is not None
        if self.delivery:
            # Every output alike, failures too, so none overtakes the tokens before it.
            d = self.delivery
            earlier = out.earlier_ticks  # a decode run's ticks, delivered alike
            asyncio.get_running_loop().call_later(d, self._sink, self.id, out.at(
                out.time + d, earlier and [t + d for t in earlier]))
        else:
            self._sink(self.id, out)

    def _fail(self, error: str, suspects: tuple[str, ...] = (),
              before: list[tuple[str, RequestStatus]] | None = None) -> None:
        self._flush_run()  # the steps a decode run took before it broke
        self._ended = True  # as the task's loop returns
        ids = self.engine.fail_all()
        now = asyncio.get_running_loop().time()
        self._emit(StepOutput(
            now, [], None,
            [*(before or []), *((rid, RequestStatus.FINISHED_ABORTED) for rid in ids)],
            error, suspects, moves=self.engine.cohort_moves()))

    def _broken(self, e: Exception) -> None:
        """The engine itself raised (not a step's requests): the instance fails."""
        self._fail(f"instance {self.id} failed: {type(e).__name__}: {e}")

    def _step_failed(self, e: StepFailed, failures_in_a_row: int) -> bool:
        """A step raised. One request alone in it, the first time in a row: that request
        failed, not the instance (one bad request never takes an instance down).
        Otherwise the instance is broken: fail it, and name the step's requests as suspects,
        which are never resumed elsewhere. Returns whether the instance goes on."""
        now = asyncio.get_running_loop().time()
        if len(e.request_ids) == 1 and failures_in_a_row <= MAX_FAILED_STEPS_IN_A_ROW:
            (rid,) = e.request_ids
            self.engine.fail_request(rid)
            self._emit(StepOutput(
                now, [], None, [*e.transitions, (rid, RequestStatus.FINISHED_FAILED)],
                failure=f"request {rid} failed on instance {self.id}: {e}",
                moves=self.engine.cohort_moves()))
            return True
        self._fail(f"instance {self.id} failed: {e}", tuple(e.request_ids), e.transitions)
        return False

    async def _run(self) -> None:
        engine = self.engine
        while True:
            if not engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            steps = engine.num_steps
            try:
                out = await engine.step()
            except StepFailed as e:
                if self._failed_step(e):
                    continue
                return
            except Exception as e:  # a broken engine must not leave requests hanging
                self._broken(e)
                return
            if not self._stepped(out, steps):
                await self._wake.wait()

    # ---- the timer driver: ``_run``'s loop for steps that are only waits --------------------
    def _cycle(self) -> None:
        """``_run``'s loop from its top: step until a step is in flight (its end is a timer)
        or there is nothing to do (then ``_kick`` resumes it)."""
        self._handle = None
        if self._ended:
            return
        engine = self.engine
        loop = asyncio.get_running_loop()
        while True:
            if not engine.has_work():
                self._waiting = True
                return
            if not steps_are_waits(engine.executor):
                # Its ``execute`` was replaced (a fault injected): from now on it is awaited.
                self._timed = False
                self._task = loop.create_task(self._run(), name=f"instance-{self.id}")
                return
            steps = engine.num_steps
            try:
                begun = engine.begin_step(loop)
                if isinstance(begun, DecodeRun):
                    engine.arm_run(begun, partial(self._run_ended, begun, steps))
                    return
                if isinstance(begun, PlannedStep):
                    try:
                        wait = engine.executor.duration(begun.out.shape)[0]  # type: ignore[attr-defined]
                    except Exception as e:
                        raise begun.failed(e) from e
                    if wait > 0:  # at loop.time() + wait, as asyncio.sleep(wait) ends
                        self._handle = loop.call_at(loop.time() + wait,
                                                    self._step_ended, begun, steps)
                    else:  # as asyncio.sleep(0): after one pass of the loop
                        self._handle = loop.call_soon(self._step_ended, begun, steps)
                    return
                out = begun
            except StepFailed as e:
                if self._failed_step(e):
                    continue
                return
            except Exception as e:  # a broken engine must not leave requests hanging
                self._broken(e)
                return
            if not self._stepped(out, steps):
                return

    def _step_ended(self, begun: PlannedStep, steps: int) -> None:
        """A step's timer: advance, and go on."""
        self._ended_then_cycle(partial(self.engine.end_step, begun, None), steps)

    def _run_ended(self, run: DecodeRun, steps: int) -> None:
        """A decode run's timer (at its last step, or the step a cut left it): the same."""
        self._ended_then_cycle(partial(self.engine.end_run, run), steps)

    def _ended_then_cycle(self, end: Callable[[], StepOutput], steps: int) -> None:
        self._handle = None
        if self._ended:
            return
        try:
            out = end()
        except Exception as e:  # as ``_run``: a broken engine fails its requests
            self._broken(e)
            return
        if self._stepped(out, steps):
            self._cycle()

    def _failed_step(self, e: StepFailed) -> bool:
        """A step raised (either driver): ``_step_failed``, counting the failures in a row
        (kept across a hand-over from the timer driver to the task driver)."""
        self._failures_in_a_row += 1
        return self._step_failed(e, self._failures_in_a_row)

    def _stepped(self, out: StepOutput, steps: int) -> bool:
        """A step ended well (either driver): emit; False when the driver must wait for work
        (nothing could be planned although work is queued: KV held for migration). Decided
        before the emit: a listener that gives this instance work at once then finds it
        waiting, and wakes it (``_kick``)."""
        self._failures_in_a_row = 0
        stalled = self.engine.num_steps == steps and self.engine.has_work()
        self._waiting = stalled
        if stalled:
            self._wake.clear()
        if out.request_ids or out.transitions or out.ticked or out.moves:
            self._emit(out)
        return not stalled


class LocalPlacement:
    """Engines from ``make_engine``, each driven by a task on this process's loop; their
    outputs reach the control plane ``delivery`` seconds after each step (LocalInstance)."""

    def __init__(self, make_engine: EngineFactory, delivery: float = 0.0) -> None:
        self.make_engine = make_engine
        self.delivery = delivery

    def initial(self, configs: list[tuple[int, EngineConfig]]) -> list[Instance]:
        return [LocalInstance(iid, self.make_engine(cfg), self.delivery) for iid, cfg in configs]

    def describe_launch(self, plan: Plan) -> str:
        return plan.describe()

    async def launch(self, instance_id: int, config: EngineConfig, plan: Plan) -> Instance:
        if isinstance(self.make_engine, WeightLoadingFactory) and self.make_engine.holds_weights:
            # Real weights by the planned path, on a worker thread: the loop keeps serving
            # (the copies release the GIL).
            make = self.make_engine.loading(plan.path)
            engine = await asyncio.get_running_loop().run_in_executor(None, make, config)
        else:
            await asyncio.sleep(plan.seconds)
            engine = self.make_engine(config)
        return LocalInstance(instance_id, engine, self.delivery)
