# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""EngineCore: one instance's queues, KV accounting and step loop.

``step()`` = plan (``begin_step``) → execute → advance (``end_step``) → emit token events; a
driver that times a step itself (the simulator's, on loop timers: hfx/backends/local.py) calls
the two halves around its own wait. The core is the same whether the executor is simulated or
real, and whether the loop's clock is virtual or not: it reads time only from the running loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from mypy_extensions import mypyc_attr

from hfx.engine.admission import Admission
from hfx.engine.block_manager import BlockManager
from hfx.engine.cohort import DecodeCohort
from hfx.engine.config import EngineConfig
from hfx.engine.decode_run import DecodeRun, plan_run
from hfx.engine.errors import EngineError, StepFailed
from hfx.engine.executor import PLACEHOLDER_TOKEN, Executor
from hfx.engine.planners import EngineState, SchedulerOutput, make_planner
from hfx.engine.sequence import RequestStatus, Role, Sequence
from hfx.sim.clock import VirtualTimeLoop
from hfx.stepmodel.step_time import StepTimeModel


@dataclass(slots=True, init=False)
class StepOutput:
    """What one step (or a step boundary) produced on this engine.

    ``request_ids`` lists every request that sampled a token at ``time``; ``token_ids`` holds
    those tokens in the same order, or is None when the executor produces none (simulation).
    ``transitions`` lists (request id, new status) for every request that left RUNNING:
    finished, prefilled (prefill role) or aborted. Compact on purpose: the simulator appends one
    entry per generated token.
    """

    time: float
    request_ids: list[str]
    token_ids: list[int] | None
    transitions: list[tuple[str, RequestStatus]]
    # Set when the engine broke: every request it held is in ``transitions`` as aborted.
    error: str | None
    # With ``error``: the requests of the step that raised. One of them may have caused it,
    # so none of them is resumed elsewhere.
    suspects: tuple[str, ...]
    # Why the FINISHED_FAILED requests in ``transitions`` failed.
    failure: str | None
    # Each token's own time, where they differ (a relayed stream's batch); else
    # every token is at ``time``.
    token_times: list[float] | None
    # The decode cohort (cohort.py) took a step: each member sampled a token at ``time``,
    # which ``request_ids`` does not list. Members join and leave at a tick, in this order, as
    # (request id, tick, joined): a member's tokens are the times of the instance's ticks
    # (join, leave].
    ticked: bool
    moves: list[tuple[str, int, bool]] | None
    # A decode run (decode_run.py) took several cohort steps: the times of those before the
    # one at ``time``, each a tick.
    earlier_ticks: list[float] | None
    # (request id, prompt tokens found in the prefix cache) for the requests first admitted
    # since the last output with a hit: the records' cached tokens (RequestRecord).
    cached: list[tuple[str, int]] | None

    # Written out, not generated: one a step, compiled (as hfx.request.Request's).
    def __init__(self, time: float, request_ids: list[str], token_ids: list[int] | None,
                 transitions: list[tuple[str, RequestStatus]], error: str | None = None,
                 suspects: tuple[str, ...] = (), failure: str | None = None,
                 token_times: list[float] | None = None, ticked: bool = False,
                 moves: list[tuple[str, int, bool]] | None = None,
                 earlier_ticks: list[float] | None = None,
                 cached: list[tuple[str, int]] | None = None) -> None:
        self.time, self.request_ids, self.token_ids = time, request_ids, token_ids
        self.transitions, self.error, self.suspects = transitions, error, suspects
        self.failure, self.token_times, self.ticked = failure, token_times, ticked
        self.moves, self.earlier_ticks, self.cached = moves, earlier_ticks, cached

    def __reduce__(self) -> tuple[type[StepOutput], tuple[object, ...]]:
        # Through the constructor, one format compiled and as Python (hfx/native.py).
        return StepOutput, (self.time, self.request_ids, self.token_ids, self.transitions,
                            self.error, self.suspects, self.failure, self.token_times,
                            self.ticked, self.moves, self.earlier_ticks, self.cached)

    def at(self, time: float, earlier_ticks: list[float] | None) -> StepOutput:
        """The same output at other times (a delivery's latency, another clock)."""
        return StepOutput(time, self.request_ids, self.token_ids, self.transitions, self.error,
                          self.suspects, self.failure, self.token_times, self.ticked,
                          self.moves, earlier_ticks, self.cached)


@dataclass(slots=True, init=False)
class PlannedStep:
    """A step ``begin_step`` planned, for the executor to run and ``end_step`` to advance."""

    out: SchedulerOutput
    cohort: DecodeCohort | None  # the decode cohort, when the plan has one
    transitions: list[tuple[str, RequestStatus]]  # aborts applied at its start
    start: float

    def __init__(self, out: SchedulerOutput, cohort: DecodeCohort | None,
                 transitions: list[tuple[str, RequestStatus]], start: float) -> None:
        self.out, self.cohort, self.transitions, self.start = out, cohort, transitions, start

    def failed(self, error: Exception) -> StepFailed:
        """The step raised ``error`` running: its requests and the aborts at its start."""
        return StepFailed(error, self.out.request_ids(), self.transitions)


# Compiled (hfx/native.py), it may still be subclassed in Python: tests count its decode runs.
@mypyc_attr(allow_interpreted_subclasses=True)
class EngineCore:
    def __init__(self, config: EngineConfig, executor: Executor,
                 step_model: StepTimeModel | None = None) -> None:
        self.config = config
        self.executor = executor
        # Planners that pace by time need the instance's step-time model; a SimExecutor has it
        # (a real executor's ``model`` is its network: it is given one, or has none).
        self.planner = make_planner(config, step_model or getattr(executor, "step_model", None))
        # A real executor runs sequences: it is given the cohort's members one by one, and
        # reports their tokens one by one, and it reads their KV blocks' ids.
        self._expand = not getattr(executor, "plans_by_shape", False)
        self.kv = BlockManager(config.num_kv_blocks, config.block_size, block_ids=self._expand,
                               prefix_caching=config.prefix_caching)
        self.state = EngineState(waiting=self.planner.make_waiting(self.kv.blocks_for),
                                 running=[], kv=self.kv)
        if config.engine_runs and self.planner.takes_cohort():
            # A real executor reads each block's id: its members get their blocks one by one.
            self.state.cohort = DecodeCohort(config.block_size, events=not self._expand,
                                             kv=None if self._expand else self.kv)
        # Several cohort steps as one timer (decode_run.py), on a virtual clock.
        self._runs = self.state.cohort is not None and not self._expand and \
            getattr(executor, "advances_runs", False)
        self._run: DecodeRun | None = None
        self._joining: list[Sequence] = []  # imports admitted, to join the cohort
        self.held: dict[str, Sequence] = {}  # prefill role: prefilled, KV held for migration
        self.incoming: dict[str, Sequence] = {}  # decode role: KV reserved, transfer under way
        # Decode role: KV arrived, waiting in arrival order for a sequence slot. An import
        # counts against max_num_seqs like any request (as in vLLM's scheduler).
        self.ready: dict[str, Sequence] = {}
        self._seqs: dict[str, Sequence] = {}
        self._aborts: list[str] = []
        self.num_steps = 0
        self.num_preemptions = 0  # sequences preempted (recompute), as vLLM's counter of them
        self.busy_time = 0.0  # seconds spent executing steps
        # Fixed for the engine's life (a role switch changes none of it): built once, not per
        # request.
        self.admission = Admission(config.max_model_len, config.num_kv_blocks, config.block_size,
                                   getattr(executor, "needs_token_ids", False),
                                   getattr(executor, "vocab_size", None))

    # ---- requests in and out -------------------------------------------------------------
    def check(self, prompt_len: int, max_tokens: int) -> None:
        """Raise EngineError if a request of this size can never run here."""
        self.admission.check_size(prompt_len, max_tokens)

    def add_request(self, seq: Sequence) -> None:
        """Queue a sequence. On a decode instance it arrives with its KV computed."""
        if seq.request_id in self._seqs:
            raise EngineError(f"duplicate request id {seq.request_id!r}")
        self.admission.check(seq.request_id, seq.prompt_len, seq.max_tokens,
                             seq.prompt_token_ids)
        if self._run is not None:
            self._cut_run()
        seq.status = RequestStatus.WAITING
        self._seqs[seq.request_id] = seq
        self.state.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Abort at the next step boundary; False if the request is not here."""
        if request_id not in self._seqs:
            return False
        if self._run is not None:
            self._cut_run()
        self._aborts.append(request_id)
        return True

    def export_kv(self, request_id: str) -> object | None:
        """Prefill role: a copy of a held sequence's KV, or None when the executor holds no real
        cache (simulation)."""
        read = getattr(self.executor, "read_kv", None)
        return None if read is None else read(self.held[request_id])

    def release(self, request_id: str) -> Sequence:
        """Prefill role: hand a held sequence over for migration and free its KV here."""
        seq = self.held.pop(request_id)
        self.kv.free(seq)
        seq.status = RequestStatus.FINISHED_MIGRATED
        del self._seqs[request_id]
        return seq

    def reserve_import(self, seq: Sequence) -> bool:
        """Decode role: allocate blocks for a sequence's KV before it is transferred here.

        False, with nothing allocated, when the blocks are not free: the migration waits
        rather than overcommits.
        """
        if seq.request_id in self._seqs:
            raise EngineError(f"duplicate request id {seq.request_id!r}")
        self.check(seq.prompt_len, seq.max_tokens)
        if self._run is not None:
            self._cut_run()
        # Room for the transferred KV and the token the first decode step writes.
        if not self.kv.allocate(seq, seq.num_tokens, self.config.watermark_blocks):
            return False
        self.incoming[seq.request_id] = seq
        self._seqs[seq.request_id] = seq
        # Its place in the arrival order: vLLM's preemption and requeue order read it.
        self.state.waiting.number(seq)
        return True

    def activate_import(self, request_id: str, kv: object | None = None) -> None:
        """Decode role: the KV has arrived (``kv``, from ``export_kv`` elsewhere, or None in
        simulation); the sequence decodes from the next step."""
        if self._run is not None:
            self._cut_run()
        seq = self.incoming.pop(request_id)
        if kv is not None:
            self.executor.write_kv(seq, kv)  # type: ignore[attr-defined]
        self.ready[request_id] = seq
        self._admit_ready()

    def _admit_ready(self) -> None:
        """Imports whose KV is here start decoding while sequence slots are free."""
        state, ready = self.state, self.ready
        while ready and len(state.running) < self.config.max_num_seqs:
            seq = ready.pop(next(iter(ready)))
            state.run(seq)
            if state.cohort is not None:
                # It joins the cohort when the next step is planned: one in flight now
                # does not decode it.
                self._joining.append(seq)

    # ---- introspection ----------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.state.waiting) + len(self.ready)

    @property
    def num_running(self) -> int:
        return len(self.state.running)

    def has_work(self) -> bool:
        return bool(self.state.waiting or self.state.running or self.ready or self._aborts)

    @property
    def decode_ctx(self) -> int:
        """Σ num_tokens over the running sequences (what Eq. 2 needs)."""
        cohort = self.state.cohort
        if cohort is None:
            return sum(s.num_tokens for s in self.state.running)
        return cohort.decode_ctx + sum(s.num_tokens for s in self.state.running
                                       if not s.in_cohort)

    def get(self, request_id: str) -> Sequence | None:
        self.catch_up()
        seq = self._seqs.get(request_id)
        if seq is not None and seq.in_cohort:
            self.state.cohort.sync(seq)  # type: ignore[union-attr]  # a member: there is one
        return seq

    def fail_request(self, request_id: str) -> None:
        """Drop one request whose step raised (the engine goes on); frees its KV."""
        seq = self._seqs.pop(request_id)
        if self.state.cohort is not None:
            self.state.cohort.discard(seq)
        if seq in self.state.running:
            self.state.running.remove(seq)
        elif seq in self.state.waiting:
            self.state.waiting.remove(seq)
        self.kv.free(seq, computed=False)
        seq.status = RequestStatus.FINISHED_FAILED

    def fail_all(self) -> list[str]:
        """The engine cannot go on (its executor raised): drop every request, free all KV;
        returns their ids."""
        run = self._run
        if run is not None:  # the step awaiting it returns having advanced nothing more
            self.catch_up()
            run.length = run.applied
            if run.timer is not None:
                run.timer.cancel()
            self._run = None
            if run.ended is not None:
                run.ended()
        ids = list(self._seqs)
        if self.state.cohort is not None:
            self.state.cohort.clear()
        for seq in self._seqs.values():
            self.kv.free(seq, computed=False)
            seq.status = RequestStatus.FINISHED_ABORTED
        self._seqs.clear()
        self.state.waiting.clear()
        self.state.running.clear()
        self.held.clear()
        self.incoming.clear()
        self.ready.clear()
        self._aborts.clear()
        self._joining.clear()
        return ids

    # ---- the step -------------------------------------------------------------------------
    # A step is begun (plan), executed (the executor's await, or a timer: LocalInstance) and
    # ended (advance): ``step`` does all three; a driver that times steps itself calls
    # ``begin_step`` and ``end_step`` around its own wait.
    async def step(self) -> StepOutput:
        loop = asyncio.get_running_loop()
        begun = self.begin_step(loop)
        if isinstance(begun, StepOutput):
            return begun
        if isinstance(begun, DecodeRun):
            done: asyncio.Future[None] = loop.create_future()
            self.arm_run(begun, partial(_resolve, done))
            await done
            return self.end_run(begun)
        try:
            sampled = await self.executor.execute(begun.out)
        except Exception as e:
            # The caller decides whether to fail the step's requests alone (fail_request) or
            # the whole engine (fail_all).
            raise begun.failed(e) from e
        return self.end_step(begun, sampled)

    def begin_step(self, loop: asyncio.AbstractEventLoop) -> StepOutput | PlannedStep | DecodeRun:
        """Plan the next step: its plan to execute, a decode run to arm (``arm_run``), or, when
        nothing could be planned, the step boundary's output."""
        transitions: list[tuple[str, RequestStatus]] = []
        if self._aborts:
            self._apply_aborts(transitions)
        if self.ready:
            self._admit_ready()
        if self._joining:
            for seq in self._joining:
                if seq.status is RequestStatus.RUNNING and not seq.in_cohort:
                    self.state.cohort.join(seq)  # type: ignore[union-attr]  # _joining: one
            self._joining.clear()
        self.state.now = loop.time()
        # Aborts applied now are reported at the end of this step: a run would report them
        # late.
        if self._runs and not transitions and not self.state.waiting and \
                isinstance(loop, VirtualTimeLoop):
            run = self._start_run(loop)
            if run is not None:
                return run
        out = self.planner.plan(self.state)
        self.num_preemptions += len(out.preempted)
        while not out and out.preempted:
            # It preempted and planned nothing (vLLM's victim was the sequence that needed
            # the block, first in the running list): plan again with the blocks freed, as
            # vLLM's next iteration does, or the engine would idle with work.
            out = self.planner.plan(self.state)
            self.num_preemptions += len(out.preempted)
        if not out:
            return self._output(loop.time(), [], None, transitions)
        cohort = out.cohort
        if cohort is not None and self._expand:
            # The executor runs each member (running-list order, then the prompts, as a
            # per-sequence plan has them); the core then advances them one by one too.
            cohort.sync_all()
            out.num_scheduled_tokens = {**dict.fromkeys(cohort.in_running_order(), 1),
                                        **out.num_scheduled_tokens}
            out.cohort = None
        return PlannedStep(out, cohort, transitions, loop.time())

    def end_step(self, step: PlannedStep, sampled: dict[Sequence, int] | None) -> StepOutput:
        """The planned step has run (``sampled``: the executor's tokens, if real): advance."""
        now = asyncio.get_running_loop().time()
        out, cohort, transitions = step.out, step.cohort, step.transitions
        self.num_steps += 1
        self.busy_time += now - step.start
        request_ids: list[str] = []
        token_ids: list[int] | None = None if sampled is None else []
        ticked = False
        if cohort is not None:
            ticked = self._advance_cohort(cohort, out.cohort is None, transitions)
        self._advance(out.num_scheduled_tokens, sampled, request_ids, token_ids, transitions)
        if cohort is not None and out.cohort is None:
            cohort.purge()
        if self._aborts:  # arrived while the step ran
            self._apply_aborts(transitions)
        return self._output(now, request_ids, token_ids, transitions, ticked)

    # ---- decode runs (decode_run.py) ---------------------------------------------------------
    def _start_run(self, loop: asyncio.AbstractEventLoop) -> DecodeRun | None:
        """Several cohort steps as one timer, when every running sequence is a member (no
        prompt under way) and the run can take two steps or more."""
        cohort = self.state.cohort
        assert cohort is not None
        if not cohort or len(self.state.running) != len(cohort):
            return None
        now = loop.time()
        planned = plan_run(cohort, self.kv, self.executor, now)
        if planned is None:
            return None
        times, factors = planned
        run = DecodeRun(now, times, factors, len(times))
        self._run = run
        self._plan_run_step(cohort)
        return run

    def arm_run(self, run: DecodeRun, ended: Callable[[], None]) -> None:
        """Call ``ended`` when the run begun by ``begin_step`` has taken its last step (then
        ``end_run``); a cut moves that to the step under way."""
        run.ended = ended
        run.timer = asyncio.get_running_loop().call_at(run.times[-1], ended)

    def _plan_run_step(self, cohort: DecodeCohort) -> None:
        """A run's step planned: the blocks of the members crossing into one now, in one
        count (as ``BatchPlanner.decode_cohort``; the run counted them free)."""
        if cohort.crossing():
            raise AssertionError("a decode run planned a block that is not free")

    def _apply_run_step(self, run: DecodeRun,
                        transitions: list[tuple[str, RequestStatus]] | None) -> None:
        """A run's next step ended: its tick, the engine's counters, the next step's plan."""
        cohort = self.state.cohort
        assert cohort is not None
        i = run.applied
        done = cohort.step()
        if done:  # a run ends at the first finish
            assert transitions is not None and i == run.length - 1
            self._finish_members(done, transitions)
        self.num_steps += 1
        end = run.times[i]
        self.busy_time += end - (run.times[i - 1] if i else run.start)
        run.applied = i + 1
        if run.applied < run.length:
            self.state.now = end
            self._plan_run_step(cohort)

    def end_run(self, run: DecodeRun) -> StepOutput:
        """The run's last step has ended (its ``ended`` was called): apply its steps."""
        transitions: list[tuple[str, RequestStatus]] = []  # none at its start (begin_step)
        self._run = None
        # Its callback holds the run: let go, the pair is freed now, not by the cyclic collector.
        run.ended = run.timer = None
        if run.length == run.applied:  # failed meanwhile (fail_all)
            return self._output(asyncio.get_running_loop().time(), [], None, transitions)
        while run.applied < run.length:
            self._apply_run_step(run, transitions)
        if self._aborts:  # arrived while the run's last step ran
            self._apply_aborts(transitions)
        last = run.length - 1
        return StepOutput(run.times[last], [], None, transitions, ticked=True,
                          moves=self.cohort_moves(),
                          earlier_ticks=run.times[run.reported:last] or None)

    def flush_run(self) -> StepOutput | None:
        """The steps of a decode run under way that have ended by now and are not reported
        yet, as one output (None if none): what stepping would have reported by now, for a
        reader of the records that will not wait for the run's end (a simulation stopping)."""
        run = self._run
        if run is None:
            return None
        self.catch_up()
        ticks = run.times[run.reported:run.applied]
        if not ticks:
            return None
        run.reported = run.applied
        return StepOutput(ticks[-1], [], None, [], ticked=True, moves=self.cohort_moves(),
                          earlier_ticks=ticks[:-1] or None)

    def catch_up(self) -> None:
        """Bring a decode run to the loop's time, as stepping would have it: the steps ended
        by now applied, the one under way planned. Before anything reads the engine."""
        run = self._run
        if run is None:
            return
        now = asyncio.get_running_loop().time()
        last = run.length - 1  # the timer ends it
        while run.applied < last and run.times[run.applied] < now:
            self._apply_run_step(run, None)

    def _cut_run(self) -> None:
        """Something changes the engine: its run ends with the step under way, and the next
        step is planned with the change, as stepping would have it."""
        self.catch_up()
        run = self._run
        assert run is not None
        if run.length == run.applied + 1:
            return
        self.executor.put_back(run.factors[run.applied + 1:run.length])  # type: ignore[attr-defined]
        run.length = run.applied + 1
        loop = asyncio.get_running_loop()
        assert run.timer is not None and run.ended is not None
        run.timer.cancel()
        run.timer = loop.call_at(run.times[run.applied], run.ended)

    def _output(self, now: float, request_ids: list[str], token_ids: list[int] | None,
                transitions: list[tuple[str, RequestStatus]], ticked: bool = False
                ) -> StepOutput:
        return StepOutput(now, request_ids, token_ids, transitions, ticked=ticked,
                          moves=self.cohort_moves(), cached=self._take_hits())

    def _take_hits(self) -> list[tuple[str, int]] | None:
        hits = self.kv.hits
        if not hits:
            return None
        self.kv.hits = []
        return hits

    def cohort_moves(self) -> list[tuple[str, int, bool]] | None:
        """The cohort's joins and leaves not yet reported (StepOutput.moves)."""
        cohort = self.state.cohort
        return None if cohort is None else cohort.take_moves()

    def _advance_cohort(self, cohort: DecodeCohort, expanded: bool,
                        transitions: list[tuple[str, RequestStatus]]) -> bool:
        """Every member decoded one token: one tick. ``expanded``: the members were run one by
        one and ``_advance`` gives each its sampled token (a stop token ends one early), and
        reports it; else the step's output says the cohort ticked. Returns which."""
        if expanded:
            cohort.tick += 1  # the members' fields catch up in ``_advance``
            return False
        done = cohort.step()
        if done:
            self._finish_members(done, transitions)
        return True

    def _finish_members(self, done: list[Sequence],
                        transitions: list[tuple[str, RequestStatus]]) -> None:
        """Members a cohort step brought to ``max_tokens``: finished, retired."""
        length = RequestStatus.FINISHED_LENGTH
        for seq in done:
            seq.status = length
            transitions.append((seq.request_id, length))
        self._retire(done)

    def _advance(self, scheduled: dict[Sequence, int], sampled: dict[Sequence, int] | None,
                 request_ids: list[str], token_ids: list[int] | None,
                 transitions: list[tuple[str, RequestStatus]]) -> None:
        # The hot loop of a simulation, once per scheduled sequence per step; it inlines
        # Sequence.append_token.
        finished: list[Sequence] = []
        running = RequestStatus.RUNNING
        after_first = RequestStatus.PREFILLED if self.config.role is Role.PREFILL else running
        cohort = self.state.cohort
        for seq, n in scheduled.items():
            computed = seq.num_computed_tokens + n
            seq.num_computed_tokens = computed
            if computed < seq.num_tokens:
                continue  # a prompt chunk: nothing to sample yet
            request_ids.append(seq.request_id)
            if sampled is None:
                token = PLACEHOLDER_TOKEN
                stopped = False
            else:
                token = sampled[seq]
                token_ids.append(token)  # type: ignore[union-attr]
                stopped = token in seq.stop_token_ids
            seq.output_token_ids.append(token)
            seq.num_tokens = computed + 1
            if stopped:
                status = RequestStatus.FINISHED_STOPPED
            elif computed + 1 - seq.prompt_len >= seq.max_tokens:
                status = RequestStatus.FINISHED_LENGTH
            else:
                status = after_first
            if status is not running:
                seq.status = status
                finished.append(seq)
                transitions.append((seq.request_id, status))
            elif cohort is not None and not seq.in_cohort:
                cohort.join(seq)  # its first token: it decodes with the others from now on
        if finished:
            self._retire(finished)

    def _retire(self, seqs: list[Sequence]) -> None:
        running = self.state.running
        if len(seqs) < 8:  # the usual few
            for seq in seqs:
                del running[_position(running, seq)]
        else:
            done = set(seqs)
            running[:] = [s for s in running if s not in done]
        cohort = self.state.cohort
        for seq in seqs:
            if cohort is not None:
                cohort.discard(seq)  # a member a real executor stopped
            if seq.status is RequestStatus.PREFILLED:
                self.held[seq.request_id] = seq
            else:
                self.kv.free(seq)
                del self._seqs[seq.request_id]

    def _apply_aborts(self, transitions: list[tuple[str, RequestStatus]]) -> None:
        for rid in self._aborts:
            seq = self._seqs.pop(rid, None)
            if seq is None:
                continue  # finished before the abort took effect
            # An import (its KV on the way, or here and waiting for a slot) is in neither
            # queue, whatever status it brought from its prefill instance.
            if rid in self.incoming:
                del self.incoming[rid]
            elif rid in self.ready:
                del self.ready[rid]
            elif seq.status is RequestStatus.WAITING:
                self.state.waiting.remove(seq)
            elif seq.status is RequestStatus.RUNNING:
                self.state.running.remove(seq)
                if self.state.cohort is not None:
                    self.state.cohort.discard(seq)
            elif seq.status is RequestStatus.PREFILLED:
                del self.held[rid]
            self.kv.free(seq)
            seq.status = RequestStatus.FINISHED_ABORTED
            transitions.append((rid, seq.status))
        self._aborts.clear()


def _position(seqs: list[Sequence], seq: Sequence) -> int:
    """Where ``seq`` is in ``seqs``, by identity. ``list.remove`` compares with ``==``: for
    each other element a rich comparison that reads its type, a cache miss per running sequence
    in a large fleet; this compares pointers only."""
    for i in range(len(seqs)):
        if seqs[i] is seq:
            return i
    raise ValueError(f"{seq.request_id} is not in the list")


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
