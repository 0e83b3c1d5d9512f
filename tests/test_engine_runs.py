"""The decode cohort and decode runs against stepping each sequence, on many small random cases.

For the planners whose decode steps take every decoding sequence (prefill-first, TPOT-chunked,
deadline-chunked; chunked and vLLM's where nobody is preempted) the engine core advances the
running decodes by one counter per step (hfx/engine/cohort.py), and on a virtual clock with a
``SimExecutor`` may take several such steps as one timer, a decode run
(hfx/engine/decode_run.py): one ``step()`` call, one StepOutput whose ``earlier_ticks`` lists
the earlier steps. ``EngineConfig(engine_runs=False)``
turns both off and steps each sequence as before. The two must give the same results to the
last bit. tests/test_golden.py checks that on its fixed cases; these draw seeded random ones
that reach what those may not:

- engine level, the cohort alone, step for step (its engine's executor takes no runs: this
  driver's script and trace are per ``step()`` call, which a run changes by design): a small KV
  cache and block sizes down to one token (members preempted by recompute, a new block at every
  tick), one-token prompts and outputs, arrivals and aborts before a step or while one runs,
  P/D imports whose KV lands mid-step, mid-run reads (``EngineCore.get``,
  ``RequestRecord.times`` over open runs), step-time noise. Compared step by step: the step's
  time and transitions, every request's token count as a ``RequestLedger`` records it (the
  cohort's ``TokenRun``s over the tick log), each sequence's status, KV blocks and preemptions,
  the engine's counters; at the end every sequence's fields and every record's token times.
- engine level, decode runs: a script of timers at virtual times (arrivals, aborts, P/D
  reservations and KV landings, probes), each engine driven as ``LocalInstance._run`` drives
  it. Long outputs, so runs are taken, cut by the changes that land while they go (with step
  noise: the cut steps' factors put back), and shortened by a small KV cache. Compared: every
  step's end time (a run's StepOutput stands for its ``earlier_ticks`` and ``time``), the
  transitions, reservations and aborts with their times, what a probe reads after
  ``catch_up()`` mid-run (KV, queues, ``decode_ctx``, counters, a sequence's fields and
  blocks), and at the end every sequence, every record's token times, the counters. A
  one-case test pins a known mismatch (an abort reported at a run's end), expected to fail.
- cluster level: small simulated runs across policies, P/D, scaling, priorities, shedding,
  steady-state stops and small KV caches; every record compared.

A failure names the case (its index and settings) and the first thing that differs.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from hfx.assembly import sim_engines
from hfx.backends import local
from hfx.cluster.ledger import RequestLedger
from hfx.config import SimConfig
from hfx.engine import (
    EngineConfig,
    EngineCore,
    RequestStatus,
    Role,
    Sequence,
    SimExecutor,
    StepOutput,
)
from hfx.engine.cohort import DecodeCohort
from hfx.engine.decode_run import DecodeRun
from hfx.engine.executor import StepNoise
from hfx.request import Outcome, Request
from hfx.sim.clock import run
from hfx.sim.driver import instance_spans, load_requests, resolve_profile, run_cluster
from hfx.stepmodel.latency import load_profile

PLANNERS = ("prefill-first", "tpot-chunked", "deadline-chunked", "chunked", "vllm",
            "vllm-fcfs")  # those that plan a cohort
MODEL = load_profile("tiny@cpu").model  # ~3 ms steps: the TPOT targets below bind
TPOTS = (None, 0.004, 0.006, 0.01, 0.03)
ENGINE_CASES = 100  # per planner; ~1.5 s each
CLUSTER_CASES = 40  # ~7 s
MAX_STEPS = 50_000  # a case not drained by then is stuck
MID_STEP = 1e-9  # an action this long after a step starts lands while it runs

Action = tuple[Any, ...]


def _diff(on: Any, off: Any) -> str | None:
    """Where two values differ: the keys of dicts that differ (one level down for dicts of
    dicts), else both values; None if equal."""
    if on == off:
        return None
    if isinstance(on, dict) and isinstance(off, dict):
        keys = [k for k in {**on, **off} if on.get(k) != off.get(k)]
        return "; ".join(f"{k}: {_diff(on.get(k), off.get(k))}" for k in keys[:4])
    return f"engine_runs=True {on!r:.400}, engine_runs=False {off!r:.400}"


def draw_contents(rng: random.Random, max_prompt: int) -> list[list[int]] | None:
    """Prompt contents for a case, or None (four in ten: none). Two shared prefixes over a
    small vocabulary: prompts repeat, so the prefix cache hits, evicts and offers units."""
    if rng.random() < 0.6:
        return None
    return [[rng.randrange(8) for _ in range(max_prompt)] for _ in range(2)]


def draw_tokens(rng: random.Random, contents: list[list[int]] | None,
                prompt_len: int) -> list[int] | None:
    """A prompt of ``prompt_len`` tokens from one of ``contents``, its last token changed in
    half the cases."""
    if contents is None:
        return None
    tokens = contents[rng.randrange(len(contents))][:prompt_len]
    if rng.random() < 0.5:
        tokens[-1] = rng.randrange(8)
    return tokens


# ---- engine level ------------------------------------------------------------------------
@dataclass
class EngineCase:
    config: dict[str, Any]  # EngineConfig fields but engine_runs
    noise_cv: float
    # Per driver iteration, what happens before its step: ("add" | "abort", spec | rid, mid)
    # (``mid``: while the step runs), ("import", spec), ("probe", rid), ("sleep", seconds).
    script: list[list[Action]]

    def describe(self) -> str:
        return f"{self.config}, noise {self.noise_cv}, {sum(map(len, self.script))} events"


def draw_engine_case(rng: random.Random, planner: str) -> EngineCase:
    block_size = rng.choice((1, 2, 4, 16))
    role = Role.DECODE if rng.random() < 0.25 else Role.COLOCATED
    max_prompt = rng.choice((8, 40, 120))
    max_out = rng.choice((4, 30, 80))
    largest = -(-(max_prompt + max_out) // block_size)  # blocks of the largest request
    # Room for one largest request up to room for a few: preemption in many cases.
    num_blocks = largest + rng.randint(0, 3 * largest)
    params: dict[str, float] = {}
    if planner == "deadline-chunked" and rng.random() < 0.5:
        # Prefill-alone steps sync the cohort (sync_all) and read each decode's output.
        params = {"prefill_alone": rng.choice((0.5, 1.0)),
                  "slack_share": rng.choice((0.25, 0.4, 1.0))}
    config = {"num_kv_blocks": num_blocks, "block_size": block_size, "planner": planner,
              "planner_params": params, "role": role,
              "max_num_seqs": rng.choice((2, 4, 8, 256)),
              "max_num_batched_tokens": rng.choice((None, 16, 64, 512)),
              "watermark": rng.choice((0.0, 0.01, 0.1))}
    length = rng.randint(20, 120)
    script: list[list[Action]] = [[] for _ in range(length + 80)]
    probes = rng.random() < 0.3  # get() syncs a member, which could hide a stale read
    contents = draw_contents(rng, max_prompt)
    for i in range(rng.randint(4, 40)):
        rid = f"r{i}"
        at = rng.randrange(length)
        prompt_len = rng.randint(1, max_prompt)
        spec = {"request_id": rid, "prompt_len": prompt_len,
                "tokens": draw_tokens(rng, contents, prompt_len),
                "tpot": rng.choice(TPOTS), "ttft": rng.uniform(0.005, 0.3)}
        if role is Role.DECODE:
            # Prefilled elsewhere (its first token sampled); its KV lands now or later.
            spec["max_tokens"] = rng.randint(2, max_out)
            spec["transfer"] = rng.choice((0.0, rng.uniform(0.0, 0.03)))
            script[at].append(("import", spec))
        else:
            spec["max_tokens"] = rng.randint(1, max_out)
            script[at].append(("add", spec, rng.random() < 0.3))
        if rng.random() < 0.25:
            script[at + rng.randint(0, 79)].append(("abort", rid, rng.random() < 0.5))
        if probes:
            script[rng.randrange(len(script))].append(("probe", rid))
    for _ in range(rng.randint(0, 4)):
        script[rng.randrange(length)].append(("sleep", rng.uniform(0.0, 0.05)))
    return EngineCase(config, rng.choice((0.0, 0.0, 0.2)), script)


@dataclass
class EngineRun:
    trace: list[Any] = field(default_factory=list)  # steps, probes, reservations, in order
    final: dict[str, Any] = field(default_factory=dict)  # request id → its end state
    counters: dict[str, Any] = field(default_factory=dict)
    ticks: int = 0  # decode steps the cohort took (0 without one)
    preempted: int = 0  # sequences preempted at least once
    members_preempted: int = 0  # cohort members preempted in a step


def _view(seq: Sequence, cohort: DecodeCohort | None) -> tuple[Any, ...]:
    """A sequence's state, its token fields and blocks as a sync would make them, without
    syncing."""
    if cohort is not None and seq.in_cohort:
        n = seq.cohort_base + cohort.tick
        tokens = (n, n - 1, n - seq.prompt_len)
        blocks = cohort.blocks(seq)
    else:
        tokens = (seq.num_tokens, seq.num_computed_tokens, len(seq.output_token_ids))
        blocks = seq.num_blocks
    return (seq.status.name, tokens, blocks, tuple(seq.block_table), seq.num_preemptions)


_OUTCOME = {RequestStatus.FINISHED_LENGTH: Outcome.FINISHED,
            RequestStatus.FINISHED_ABORTED: Outcome.ABORTED}


class _StepExecutor(SimExecutor):
    # This driver acts "before step i" and compares a trace entry per ``step()`` call: a decode
    # run (several steps in one call, by design) would shift both. So the cohort alone is
    # checked here, step for step; test_engine_decode_runs checks runs on a time-based script.
    advances_runs = False


async def _drive(case: EngineCase, engine_runs: bool) -> EngineRun:
    """Play ``case``'s script on one engine, recording as the control plane would."""
    loop = asyncio.get_running_loop()
    noise = StepNoise(case.noise_cv, 7) if case.noise_cv else None
    engine = EngineCore(EngineConfig(**case.config, engine_runs=engine_runs),
                        _StepExecutor(MODEL, noise))
    assert (engine.state.cohort is not None) == (engine_runs and engine.planner.takes_cohort())
    ledger = RequestLedger()
    seqs: dict[str, Sequence] = {}
    pending: list[Sequence] = []  # imports waiting for KV room here, in arrival order
    transfer: dict[str, float] = {}  # an import's KV transfer time
    in_flight = 0  # callbacks not yet run (actions during a step, transfers)
    result = EngineRun()
    trace = result.trace

    def later(delay: float, fn: Callable[..., Any], *args: Any) -> None:
        nonlocal in_flight
        in_flight += 1

        def fire() -> None:
            nonlocal in_flight
            in_flight -= 1
            fn(*args)

        loop.call_later(delay, fire)

    def open_record(spec: dict[str, Any]) -> Sequence:
        now = loop.time()
        seq = Sequence(spec["request_id"], spec["prompt_len"], spec["max_tokens"],
                       prompt_token_ids=spec.get("tokens"), tpot=spec["tpot"],
                       prefill_deadline=now + spec["ttft"])
        seqs[seq.request_id] = seq
        ledger.open(Request(seq.request_id, now, seq.prompt_len, seq.max_tokens), None)
        return seq

    def add(spec: dict[str, Any]) -> None:
        engine.add_request(open_record(spec))

    def land(rid: str) -> None:
        if rid in engine.incoming:  # not aborted on the way
            engine.activate_import(rid)

    def abort(rid: str) -> None:
        for seq in pending:
            if seq.request_id == rid:  # not reserved here yet: it ends where it waits
                pending.remove(seq)
                ledger.settle(ledger.records[rid], Outcome.ABORTED, loop.time())
                return
        engine.abort(rid)

    def probe(rid: str) -> None:
        seq = engine.get(rid)
        fields = None if seq is None else (seq.status.name, seq.num_tokens,
                                           seq.num_computed_tokens, len(seq.output_token_ids))
        times = {r: list(rec.times()) for r, rec in ledger.records.items()}  # runs spliced
        trace.append({"probe": rid, "fields": fields, "times": times})

    script = case.script
    i = 0
    while i < len(script) or engine.has_work() or pending or in_flight:
        assert i < MAX_STEPS, "the engine did not drain"
        for action in script[i] if i < len(script) else ():
            kind = action[0]
            if kind == "add" or kind == "abort":
                fn = add if kind == "add" else abort
                if action[2]:
                    later(MID_STEP, fn, action[1])
                else:
                    fn(action[1])
            elif kind == "import":
                seq = open_record(action[1])
                seq.output_token_ids.append(0)  # the prompt computed, one token sampled
                seq.num_tokens += 1
                seq.num_computed_tokens = seq.prompt_len
                pending.append(seq)
                transfer[seq.request_id] = action[1]["transfer"]
            elif kind == "probe":
                probe(action[1])
            else:
                await asyncio.sleep(action[1])
        while pending:  # FCFS: the head waits for room, nobody overtakes it
            seq = pending[0]
            reserved = engine.reserve_import(seq)
            trace.append({"reserve": seq.request_id, "ok": reserved,
                          "kv_used": engine.kv.num_used_blocks})
            if not reserved:
                break
            pending.pop(0)
            later(transfer[seq.request_id], land, seq.request_id)
        i += 1
        if not engine.has_work():
            await asyncio.sleep(1e-3)  # idle until an arrival or a transfer lands
            continue
        cohort = engine.state.cohort
        members = {s: s.num_preemptions for s in cohort} if cohort is not None else {}
        steps = engine.num_steps
        out = await engine.step()
        assert out.earlier_ticks is None  # one step per call
        if engine.num_steps == steps:
            # Nothing could be planned (KV held by imports on the way): wait, as an instance
            # does, for something to land.
            await asyncio.sleep(1e-3)
        ledger.on_tokens(out)
        for rid, status in out.transitions:
            ledger.settle(ledger.records[rid], _OUTCOME[status], out.time)
        result.members_preempted += sum(s.num_preemptions > n for s, n in members.items())
        trace.append({
            "time": out.time, "transitions": out.transitions,
            "tokens": {rid: r.num_tokens for rid, r in ledger.records.items()},
            "kv_used": engine.kv.num_used_blocks, "running": engine.num_running,
            "waiting": engine.num_waiting, "decode_ctx": engine.decode_ctx,
            "incoming": list(engine.incoming), "ready": list(engine.ready),
            "seqs": {rid: _view(s, cohort) for rid, s in seqs.items()},
        })

    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    result.ticks = 0 if engine.state.cohort is None else engine.state.cohort.tick
    result.preempted = sum(s.num_preemptions > 0 for s in seqs.values())
    result.counters = {"steps": engine.num_steps, "busy": engine.busy_time, "end": loop.time()}
    result.final = _final(seqs, ledger)
    return result


def _final(seqs: dict[str, Sequence], ledger: RequestLedger) -> dict[str, Any]:
    """Every sequence's end state beside its record's: all ended, runs copied in."""
    final = {}
    for rid, seq in seqs.items():
        record = ledger.records[rid]
        assert record.outcome is not Outcome.PENDING and record.runs is None  # closed
        final[rid] = {
            "status": seq.status.name, "num_tokens": seq.num_tokens,
            "num_computed_tokens": seq.num_computed_tokens,
            "output_token_ids": list(seq.output_token_ids),
            "num_preemptions": seq.num_preemptions, "num_cached_tokens": seq.num_cached_tokens,
            "num_blocks": seq.num_blocks,
            "block_table": list(seq.block_table),
            "in_cohort": seq.in_cohort, "outcome": record.outcome,
            "finish_time": record.finish_time, "token_times": list(record.token_times),
        }
    return final


def run_engine_case(case: EngineCase, engine_runs: bool) -> EngineRun:
    return run(_drive(case, engine_runs), virtual=True)


@pytest.mark.parametrize("planner", PLANNERS)
def test_engine_step_for_step(planner: str) -> None:
    rng = random.Random(f"engine-runs/{planner}")  # a str seed: the same cases in any process
    ticks = preempted = members_preempted = imports = 0
    for i in range(ENGINE_CASES):
        case = draw_engine_case(rng, planner)
        on, off = run_engine_case(case, True), run_engine_case(case, False)
        where = f"case {i} of {planner} ({case.describe()})"
        for j, (a, b) in enumerate(zip(on.trace, off.trace, strict=False)):
            if a != b:
                pytest.fail(f"{where}: trace entry {j} ({a.get('time', a)!r:.80}): "
                            f"{_diff(a, b)}", pytrace=False)
        assert len(on.trace) == len(off.trace), where
        if on.final != off.final:
            pytest.fail(f"{where}: at the end: {_diff(on.final, off.final)}", pytrace=False)
        assert on.counters == off.counters, where
        ticks += on.ticks
        preempted += on.preempted > 0
        members_preempted += on.members_preempted
        imports += case.config["role"] is Role.DECODE
    # The cases reach what they are for: the cohort stepped, sequences were preempted in many
    # cases and cohort members among them, and some engines took P/D imports.
    assert ticks > 0
    assert preempted >= ENGINE_CASES // 4, preempted
    assert members_preempted > 0
    assert imports > 0


# ---- engine level: decode runs --------------------------------------------------------------
RUN_CASES = 80  # per planner; ~0.7 s each
RUN_HORIZON = 0.5  # seconds: arrivals fall in it (a 300-token output takes ~1 s alone)


@dataclass
class RunCase:
    config: dict[str, Any]  # EngineConfig fields but engine_runs
    noise_cv: float
    # (virtual time, action), each action a timer at its time: ("add" | "import", spec),
    # ("abort", rid), ("probe", rid). Times are drawn from a continuum, so none falls on a
    # step's end (which of two timers due at once fires first is not what this checks).
    script: list[tuple[float, Action]]

    def describe(self) -> str:
        return f"{self.config}, noise {self.noise_cv}, {len(self.script)} events"


def draw_run_case(rng: random.Random, planner: str) -> RunCase:
    block_size = rng.choice((1, 4, 4, 16, 16))  # 1: no run can take two steps
    role = Role.DECODE if rng.random() < 0.3 else Role.COLOCATED
    max_prompt = rng.choice((8, 60, 200))
    max_out = rng.choice((50, 120, 300))
    largest = -(-(max_prompt + max_out) // block_size)
    watermark = rng.choice((0.0, 0.01, 0.05))
    # Room for one largest request and its watermark, up to room for a few: free blocks
    # shorten runs (and preempt, between runs).
    num_blocks = largest + 1 + rng.choice((0, rng.randint(0, largest),
                                           rng.randint(0, 3 * largest)))
    num_blocks += int(watermark * num_blocks) + 1
    params: dict[str, float] = {}
    if planner == "deadline-chunked" and rng.random() < 0.5:
        params = {"prefill_alone": rng.choice((0.5, 1.0)),
                  "slack_share": rng.choice((0.25, 0.4, 1.0))}
    config = {"num_kv_blocks": num_blocks, "block_size": block_size, "planner": planner,
              "planner_params": params, "role": role,
              "max_num_seqs": rng.choice((2, 4, 256)),
              "max_num_batched_tokens": rng.choice((None, 32, 512)),
              "watermark": watermark}
    script: list[tuple[float, Action]] = []
    contents = draw_contents(rng, max_prompt)
    for i in range(rng.randint(2, 10)):
        rid = f"r{i}"
        at = rng.uniform(0.0, RUN_HORIZON)
        short = rng.random() < 0.2  # a finish soon after it joins: it ends others' runs
        prompt_len = rng.randint(1, max_prompt)
        spec = {"request_id": rid, "prompt_len": prompt_len,
                "tokens": draw_tokens(rng, contents, prompt_len),
                "max_tokens": rng.randint(2, 10) if short else rng.randint(50, max_out),
                "tpot": rng.choice(TPOTS), "ttft": rng.uniform(0.005, 0.3)}
        if role is Role.DECODE:
            spec["transfer"] = rng.choice((0.0, rng.uniform(0.0, 0.03)))
            script.append((at, ("import", spec)))
        else:
            script.append((at, ("add", spec)))
        if rng.random() < 0.3:
            script.append((at + rng.uniform(0.0, 1.0), ("abort", rid)))
    rids = [action[1]["request_id"] for _, action in script if action[0] != "abort"]
    for _ in range(rng.randint(0, 12)):
        script.append((rng.uniform(0.0, 3 * RUN_HORIZON), ("probe", rng.choice(rids))))
    return RunCase(config, rng.choice((0.0, 0.0, 0.2)), script)


class _CountingCore(EngineCore):
    """An engine core that counts its decode runs; it changes nothing."""

    def __init__(self, config: EngineConfig, executor: SimExecutor) -> None:
        super().__init__(config, executor)
        self.runs = 0  # runs taken
        self.cuts = 0  # runs cut short by a change
        self.kv_short = 0  # runs shortened, or ruled out, by the free blocks

    def _start_run(self, loop: asyncio.AbstractEventLoop) -> DecodeRun | None:
        cohort = self.state.cohort
        assert cohort is not None
        finish = cohort.next_finish()
        run = super()._start_run(loop)
        if finish is not None and len(self.state.running) == len(cohort):
            reach = min(self.kv.block_size, finish - cohort.tick)  # without the KV's limit
            got = 0 if run is None else run.length
            self.kv_short += reach >= 2 and got < reach
        self.runs += run is not None
        return run

    def _cut_run(self) -> None:
        run = self._run
        assert run is not None
        length = run.length
        super()._cut_run()
        self.cuts += run.length < length


@dataclass
class RunsRun:
    steps: list[float] = field(default_factory=list)  # each step's end time
    # In time order: transitions with their time, reservations, aborts, probes.
    events: list[Any] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)  # request id → its end state
    counters: dict[str, Any] = field(default_factory=dict)
    runs: int = 0
    cuts: int = 0
    kv_short: int = 0
    caught_up: int = 0  # probes that brought a run up to their time


async def _drive_runs(case: RunCase, engine_runs: bool) -> RunsRun:
    """Play ``case``'s timed script on one engine, driven as LocalInstance._run drives it."""
    loop = asyncio.get_running_loop()
    noise = StepNoise(case.noise_cv, 7) if case.noise_cv else None
    engine = _CountingCore(EngineConfig(**case.config, engine_runs=engine_runs),
                           SimExecutor(MODEL, noise))
    assert (engine.state.cohort is not None) == (engine_runs and engine.planner.takes_cohort())
    ledger = RequestLedger()
    wake = asyncio.Event()  # an action happened (LocalInstance's ``_wake``)
    seqs: dict[str, Sequence] = {}
    pending: list[Sequence] = []  # imports waiting for KV room here, in arrival order
    transfer: dict[str, float] = {}  # an import's KV transfer time
    fired = in_flight = 0  # actions run; KV transfers under way
    result = RunsRun()
    events = result.events

    def open_record(spec: dict[str, Any]) -> Sequence:
        now = loop.time()
        seq = Sequence(spec["request_id"], spec["prompt_len"], spec["max_tokens"],
                       prompt_token_ids=spec.get("tokens"), tpot=spec["tpot"],
                       prefill_deadline=now + spec["ttft"])
        seqs[seq.request_id] = seq
        ledger.open(Request(seq.request_id, now, seq.prompt_len, seq.max_tokens), None)
        return seq

    def land(rid: str) -> None:
        nonlocal in_flight
        in_flight -= 1
        if rid in engine.incoming:  # not aborted on the way
            engine.activate_import(rid)
        wake.set()

    def reserve() -> None:
        """FCFS: the head waits for room, nobody overtakes it. Tried as an import arrives and
        as transitions free blocks: times both engines share."""
        nonlocal in_flight
        while pending:
            seq = pending[0]
            reserved = engine.reserve_import(seq)
            events.append(("reserve", loop.time(), seq.request_id, reserved,
                           engine.kv.num_used_blocks))
            if not reserved:
                return
            pending.pop(0)
            in_flight += 1
            loop.call_later(transfer[seq.request_id], land, seq.request_id)

    def abort(rid: str) -> None:
        for seq in pending:
            if seq.request_id == rid:  # not reserved here yet: it ends where it waits
                pending.remove(seq)
                ledger.settle(ledger.records[rid], Outcome.ABORTED, loop.time())
                events.append(("abort pending", loop.time(), rid))
                return
        events.append(("abort", loop.time(), rid, engine.abort(rid)))

    def probe(rid: str) -> None:
        steps = engine.num_steps
        engine.catch_up()  # what LocalInstance.stats() does before it reads
        result.caught_up += engine.num_steps > steps  # a run's steps ended by now
        seen: list[Any] = [engine.kv.num_used_blocks, engine.num_running, engine.num_waiting,
                           engine.decode_ctx, engine.num_steps, engine.busy_time]
        seq = engine.get(rid)
        if seq is not None:
            seen.append((seq.status.name, seq.num_tokens, seq.num_computed_tokens,
                         len(seq.output_token_ids), seq.num_blocks, tuple(seq.block_table)))
        events.append(("probe", loop.time(), rid, seen))

    def act(action: Action) -> None:
        nonlocal fired
        fired += 1
        kind = action[0]
        if kind == "add":
            engine.add_request(open_record(action[1]))
        elif kind == "import":
            seq = open_record(action[1])
            seq.output_token_ids.append(0)  # the prompt computed, one token sampled
            seq.num_tokens += 1
            seq.num_computed_tokens = seq.prompt_len
            pending.append(seq)
            transfer[seq.request_id] = action[1]["transfer"]
            reserve()
        elif kind == "abort":
            abort(action[1])
        else:
            probe(action[1])
        wake.set()

    start = loop.time()
    for at, action in case.script:
        loop.call_at(start + at, act, action)
    while True:
        if not engine.has_work():
            if fired == len(case.script) and not pending and not in_flight:
                break
            wake.clear()
            await wake.wait()
            continue
        steps = engine.num_steps
        out = await engine.step()
        if engine.num_steps > steps:  # a run's StepOutput stands for each of its steps
            result.steps += [*(out.earlier_ticks or ()), out.time]
        assert len(result.steps) == engine.num_steps
        ledger.on_tokens(out, 0)
        for rid, status in out.transitions:
            ledger.settle(ledger.records[rid], _OUTCOME[status], out.time)
        if out.transitions:
            events.append(("transitions", out.time, out.transitions))
            reserve()
        if engine.num_steps == steps and engine.has_work():
            wake.clear()  # nothing could be planned: wait for a change
            await wake.wait()

    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    result.counters = {"steps": engine.num_steps, "busy": engine.busy_time, "end": loop.time()}
    result.runs, result.cuts, result.kv_short = engine.runs, engine.cuts, engine.kv_short
    result.final = _final(seqs, ledger)
    return result


def run_runs_case(case: RunCase, engine_runs: bool) -> RunsRun:
    return run(_drive_runs(case, engine_runs), virtual=True)


@pytest.mark.parametrize("planner", PLANNERS)
def test_engine_decode_runs(planner: str) -> None:
    rng = random.Random(f"engine-decode-runs/{planner}")
    runs = cuts = kv_short = noisy_cuts = caught_up = preempted = 0
    for i in range(RUN_CASES):
        case = draw_run_case(rng, planner)
        on, off = run_runs_case(case, True), run_runs_case(case, False)
        where = f"case {i} of {planner} ({case.describe()})"
        for j, (a, b) in enumerate(zip(on.steps, off.steps, strict=False)):
            if a != b:
                pytest.fail(f"{where}: step {j} ends at {a!r} with runs, {b!r} without",
                            pytrace=False)
        assert len(on.steps) == len(off.steps), where
        for a, b in zip(on.events, off.events, strict=False):
            if a != b:
                pytest.fail(f"{where}: engine_runs=True {a!r:.400}, engine_runs=False "
                            f"{b!r:.400}", pytrace=False)
        assert len(on.events) == len(off.events), where
        if on.final != off.final:
            pytest.fail(f"{where}: at the end: {_diff(on.final, off.final)}", pytrace=False)
        assert on.counters == off.counters, f"{where}: {_diff(on.counters, off.counters)}"
        assert off.runs == 0, where
        runs += on.runs
        cuts += on.cuts
        kv_short += on.kv_short
        noisy_cuts += on.cuts if case.noise_cv else 0
        caught_up += on.caught_up
        preempted += any(f["num_preemptions"] for f in on.final.values())
    # The cases reach what they are for: runs taken, runs cut (with step noise among them:
    # factors put back), runs shortened or ruled out by the free blocks, probes that read
    # mid-run, and preemptions (between runs) in some cases.
    assert runs >= 10 * RUN_CASES, runs
    assert cuts >= RUN_CASES, cuts
    assert noisy_cuts >= 10, noisy_cuts
    assert kv_short >= 10, kv_short
    assert caught_up >= 10, caught_up
    assert preempted >= 5, preempted


def _import(rid: str) -> Sequence:
    seq = Sequence(rid, 10, 40)
    seq.output_token_ids.append(0)  # prefilled elsewhere, its first token sampled
    seq.num_tokens += 1
    seq.num_computed_tokens = seq.prompt_len
    return seq


async def _abort_then_run(engine_runs: bool) -> tuple[float, list[Any], int]:
    engine = EngineCore(EngineConfig(num_kv_blocks=64, block_size=16, planner="prefill-first",
                                     role=Role.DECODE, engine_runs=engine_runs),
                        SimExecutor(MODEL))
    assert engine.reserve_import(_import("a")) and engine.reserve_import(_import("b"))
    # At one instant, while the engine has nothing to run: "a" is aborted, "b"'s KV lands.
    engine.abort("a")
    engine.activate_import("b")
    out = await engine.step()  # applies the abort, then decodes "b"
    return out.time, out.transitions, engine.num_steps


def test_abort_before_a_run() -> None:
    """An abort applied as ``step()`` starts ends its request at that step's end: the call
    takes no decode run, which would report it at the run's end."""
    on, off = (run(_abort_then_run(r), virtual=True) for r in (True, False))
    assert off[2] == 1
    assert on[:2] == off[:2], f"engine_runs=True {on}, engine_runs=False {off}"


def test_a_recompute_down_to_its_last_token_decodes_with_the_cohort() -> None:
    """A preempted sequence recomputed in chunks until one token is missing is a decode to a
    per-sequence plan (``Sequence.is_decode``): the TPOT-chunked planners must count it one
    (its TPOT sets the budget, it preempts for room) rather than as a prompt. Here the tight
    TPOT makes the prompt budget a single token, which leaves exactly that state (found by a
    review's fuzzing: this script diverged before the fix)."""
    def add(rid: str, prompt: int, tpot: float | None, ttft: float, out: int,
            mid: bool = False) -> Action:
        return ("add", {"request_id": rid, "prompt_len": prompt, "tpot": tpot, "ttft": ttft,
                        "max_tokens": out}, mid)

    script: list[list[Action]] = [[] for _ in range(200)]
    script[48] = [add("r16", 7, 0.0005, 0.005, 53)]
    script[67] = [add("r14", 7, 0.0005, 0.091, 69)]
    script[68] = [add("r8", 3, 0.0005, 0.197, 67, True)]
    script[79] = [add("r2", 2, None, 0.28, 78)]
    script[87] = [add("r13", 8, None, 0.18, 41)]
    script[92] = [add("r12", 3, 0.004, 0.009, 74)]
    script[101] = [add("r9", 2, None, 0.053, 13)]
    for planner in ("tpot-chunked", "deadline-chunked"):
        case = EngineCase({"num_kv_blocks": 12, "block_size": 16, "planner": planner,
                           "planner_params": {}, "role": Role.COLOCATED, "max_num_seqs": 256,
                           "max_num_batched_tokens": None, "watermark": 0.1}, 0.0, script)
        on, off = run_engine_case(case, True), run_engine_case(case, False)
        assert on.preempted, "the case preempts"
        for j, (a, b) in enumerate(zip(on.trace, off.trace, strict=True)):
            assert a == b, f"{planner}: trace entry {j}: {_diff(a, b)}"
        assert on.final == off.final, planner


def test_a_prompts_last_unit_is_cached_at_its_first_crossing_on_a_budget_cut_planner() -> None:
    """Chunked and vLLM's planners grow a prompt's KV only across a block boundary, and
    caching its computed units comes with that call: a prompt whose last chunk crosses no
    boundary has its last unit cached at its first decode crossing, one by one, not in the
    cohort's count. Here P (16 tokens, blocks of 4, 7-token chunks beside a decode: 7, 7, 2)
    leaves its fourth unit to its first crossing, and Q (P's 16 tokens and 4 more) is
    admitted in that step, after it: it finds all 16 cached (found by a review: with the
    crossing counted, 12)."""
    def add(rid: str, prompt: int, out: int, tokens: list[int] | None) -> Action:
        return ("add", {"request_id": rid, "prompt_len": prompt, "tpot": None, "ttft": 1.0,
                        "max_tokens": out, "tokens": tokens}, False)

    shared = list(range(1, 17))
    for planner in ("chunked", "vllm"):
        hits = {}
        for at in range(2, 8):  # Q's arrival, around P's first crossing
            script: list[list[Action]] = [[] for _ in range(40)]
            script[0] = [add("d", 1, 30, None)]
            script[1] = [add("P", 16, 10, shared)]
            script[at].append(add("Q", 20, 5, [*shared, 17, 18, 19, 20]))
            case = EngineCase({"num_kv_blocks": 64, "block_size": 4, "planner": planner,
                               "planner_params": {}, "role": Role.COLOCATED,
                               "max_num_seqs": 8, "max_num_batched_tokens": 8,
                               "watermark": 0.0}, 0.0, script)
            on, off = run_engine_case(case, True), run_engine_case(case, False)
            for j, (a, b) in enumerate(zip(on.trace, off.trace, strict=True)):
                assert a == b, f"{planner}, Q at {at}: trace entry {j}: {_diff(a, b)}"
            assert on.final == off.final, (planner, at)
            hits[at] = on.final["Q"]["num_cached_tokens"]
        # Before P's third chunk is done, its fourth unit is not computed; from the step of
        # its first crossing (4) on, it is cached.
        assert hits == {2: 12, 3: 12, 4: 16, 5: 16, 6: 16, 7: 16}, planner


def test_a_budget_cut_planner_keeps_no_cohort_when_its_budget_cannot_hold_every_decode() -> None:
    """With a token budget under ``max_num_seqs`` a chunked or vLLM step decodes only the first
    running sequences that fit: no cohort then (``BatchPlanner.takes_cohort``). Admission
    keeps a colocated engine's decodes within the budget; a decode instance's imports start
    by the slots alone. Eight imports, a budget of 4: each step decodes four of them."""
    def imp(rid: str) -> Action:
        return ("import", {"request_id": rid, "prompt_len": 2, "tpot": None, "ttft": 1.0,
                           "max_tokens": 12, "transfer": 0.0})

    for planner in ("chunked", "vllm"):
        script: list[list[Action]] = [[] for _ in range(60)]
        script[0] = [imp(f"r{i}") for i in range(8)]
        case = EngineCase({"num_kv_blocks": 64, "block_size": 4, "planner": planner,
                           "planner_params": {}, "role": Role.DECODE, "max_num_seqs": 8,
                           "max_num_batched_tokens": 4, "watermark": 0.0}, 0.0, script)
        on, off = run_engine_case(case, True), run_engine_case(case, False)
        for j, (a, b) in enumerate(zip(on.trace, off.trace, strict=True)):
            assert a == b, f"{planner}: trace entry {j}: {_diff(a, b)}"
        assert on.final == off.final, planner


async def _listened(engine_runs: bool, scenario: str) -> dict[str, tuple[int, int]]:
    """Two 40-token requests with listeners; per request (events heard, tokens recorded)."""
    loop = asyncio.get_running_loop()
    role = Role.DECODE if scenario == "import" else Role.COLOCATED
    blocks = 8 if scenario == "preempt" else 200
    block_size = 4 if scenario == "preempt" else 16
    engine = EngineCore(EngineConfig(num_kv_blocks=blocks, block_size=block_size,
                                     planner="prefill-first", role=role,
                                     engine_runs=engine_runs), SimExecutor(MODEL))
    ledger = RequestLedger()
    heard: dict[str, int] = {}

    def listener(rid: str) -> Callable[[Any], None]:
        def hear(event: Any) -> None:
            if event.token is not None:
                heard[rid] = heard.get(rid, 0) + 1
        return hear

    out_len = 20 if scenario == "preempt" else 40
    for rid in ("a", "b"):
        ledger.open(Request(rid, loop.time(), 10, out_len), listener(rid))
        seq = Sequence(rid, 10, out_len)
        if scenario == "import":  # prefilled elsewhere: its first token heard there
            seq.output_token_ids.append(0)
            seq.num_tokens += 1
            seq.num_computed_tokens = seq.prompt_len
            ledger.on_tokens(StepOutput(loop.time(), [rid], None, []), 0)
            assert engine.reserve_import(seq)
            engine.activate_import(rid)
        else:
            engine.add_request(seq)
    while engine.has_work():
        out = await engine.step()
        ledger.on_tokens(out, 0)
        for rid, status in out.transitions:
            ledger.settle(ledger.records[rid], _OUTCOME[status], out.time)
    return {rid: (heard.get(rid, 0), r.num_tokens) for rid, r in ledger.records.items()}


@pytest.mark.parametrize("scenario", ["import", "preempt"])
def test_listeners_hear_exactly_the_recorded_tokens(scenario: str) -> None:
    """A listener hears a cohort member's ticks from its join to its leave: an import joining
    as a step starts hears that step; a member preempted as a step is planned does not (the
    ledger applies the moves before each tick, not after the output's ticks)."""
    on, off = (run(_listened(r, scenario), virtual=True) for r in (True, False))
    assert on == off
    assert all(heard == recorded for heard, recorded in on.values()), on


# ---- cluster level -----------------------------------------------------------------------
CLUSTER_POLICIES = ("hfx", "rr", "polyserve", "sa", "aladdin", "least-loaded")


def draw_sim_config(rng: random.Random) -> dict[str, Any]:
    policy = rng.choice(CLUSTER_POLICIES)
    workload = rng.choice(("four-task", "two-task"))
    kw: dict[str, Any] = {
        "policy": policy, "workload": workload, "seed": rng.randrange(1000),
        "qps": rng.choice((60.0, 120.0, 200.0)),
        "requests_per_task": rng.choice((25, 50)) if workload == "four-task" else 60,
        "step_noise": rng.choice((0.0, 0.1)),
        # Explicit: a run given an engine factory (run_sim) otherwise takes none.
        "token_delivery": rng.choice((0.0, 0.002)),
    }
    shape = rng.random()
    if policy in ("hfx", "rr") and shape < 0.3:
        kw.update(mode="pd", prefill=2, decode=2)
    else:
        kw["instances"] = rng.randint(2, 4)
    if shape > 0.6:
        kw["max_instances"] = 4
    if policy == "hfx" and rng.random() < 0.4:
        kw["priorities"] = 4 if workload == "four-task" else 2  # at most one per task
    # PolyServe places nothing on an instance with a KV cache this small (the run stalls,
    # either way alike): it keeps the profile's.
    if policy != "polyserve" and rng.random() < 0.6:
        # Room for the largest request (two-task: 2,658 tokens) and a few more: preemption.
        kw["kv_capacity_tokens"] = rng.choice((3072, 4096, 8192))
    if rng.random() < 0.3:
        kw["planner"] = rng.choice(PLANNERS)  # any cohort planner under any policy
    if rng.random() < 0.3:
        kw["block_size"] = rng.choice((4, 32))
    if rng.random() < 0.2:
        kw["max_num_seqs"] = 8
    if rng.random() < 0.2:
        kw["max_wait"] = 0.2  # shed requests far past their TTFT: aborts on the instances
    if rng.random() < 0.2:
        # A steady-state run that stops on time: records left pending with open runs.
        kw.update(duration=3.0, drain=rng.choice((0.0, 0.5)))
        del kw["requests_per_task"]
    return kw


@dataclass
class ClusterRun:
    records: dict[str, dict[str, Any]]
    totals: dict[str, Any]
    ticks: int


def run_sim(kw: dict[str, Any], engine_runs: bool) -> ClusterRun:
    config = SimConfig(**kw, engine_runs=engine_runs)
    profile = resolve_profile(config)
    make = sim_engines(profile, config.step_noise, config.seed)  # what a plain run uses
    engines: list[EngineCore] = []

    def make_engine(ecfg: EngineConfig) -> EngineCore:
        engine = make(ecfg)
        engines.append(engine)
        return engine

    control, end = run(run_cluster(config, load_requests(config), profile,
                                   make_engine=make_engine), virtual=True)
    records = {rid: {"instance": r.instance, "decode_instance": r.decode_instance,
                     "dispatch_time": r.dispatch_time, "migrated_at": r.migrated_at,
                     "times": list(r.times()), "finish_time": r.finish_time,
                     "outcome": r.outcome, "error": r.error, "retries": r.retries,
                     "best_effort": r.best_effort, "slo": r.slo, "target": r.target}
               for rid, r in control.records.items()}
    totals = {"end": end, "preemptions": sum(e.num_preemptions for e in engines),
              "spans": instance_spans(control),
              "steps": sum(e.num_steps for e in engines)}
    ticks = sum(e.state.cohort.tick for e in engines if e.state.cohort is not None)
    return ClusterRun(records, totals, ticks)


def test_cluster_records() -> None:
    rng = random.Random("engine-runs/cluster")
    preempted = ticks = 0
    for i in range(CLUSTER_CASES):
        kw = draw_sim_config(rng)
        on, off = run_sim(kw, True), run_sim(kw, False)
        where = f"case {i} ({kw})"
        if on.records != off.records:
            pytest.fail(f"{where}: records differ: {_diff(on.records, off.records)}",
                        pytrace=False)
        assert on.totals == off.totals, f"{where}: {_diff(on.totals, off.totals)}"
        assert off.ticks == 0
        ticks += on.ticks
        preempted += on.totals["preemptions"] > 0
    # The cohort stepped, and the small KV caches preempted in a good share of the runs.
    assert ticks > 0
    assert preempted >= CLUSTER_CASES // 5, preempted


def test_timer_driver_runs_as_the_task_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's instances step on loop timers (LocalInstance._cycle), a real engine's on
    a task awaiting each step (LocalInstance._run): over random clusters both give the same
    records, steps and spans.

    With step-time noise. Without it, a policy can predict a step's end to the bit (sa wakes
    at the iteration boundary) and set a timer due at the same instant as the step's own; the
    timer driver ends the step at its timer, the task driver one callback later, so the two
    runs order those two callbacks differently (each deterministic)."""
    rng = random.Random("engine-runs/drivers")
    for i in range(CLUSTER_CASES):
        kw = {**draw_sim_config(rng), "step_noise": 0.1}
        timers = run_sim(kw, True)
        with monkeypatch.context() as m:
            m.setattr(local, "steps_are_waits", lambda executor: False)
            task = run_sim(kw, True)
        where = f"case {i} ({kw})"
        if timers.records != task.records:
            pytest.fail(f"{where}: records differ: {_diff(timers.records, task.records)}",
                        pytrace=False)
        assert timers.totals == task.totals, f"{where}: {_diff(timers.totals, task.totals)}"
        assert timers.ticks == task.ticks, where


@pytest.mark.parametrize("timers", [True, False], ids=["timer-driver", "task-driver"])
def test_work_given_while_a_stalled_instance_emits_is_not_lost(timers: bool) -> None:
    """An instance with work it cannot plan (its KV held for an import) waits for a change. A
    listener that makes one at once, while the instance emits that step's output, must wake it:
    here the abort's output lands the import, which then decodes, and frees room for the rest."""
    engine = EngineCore(EngineConfig(num_kv_blocks=4, block_size=16, planner="prefill-first"),
                        SimExecutor(MODEL))
    instance = local.LocalInstance(0, engine, timers=timers)
    ended: dict[str, RequestStatus] = {}

    def sink(_: int, out: Any) -> None:
        for rid, status in out.transitions:
            ended[rid] = status
            if rid == "gone":
                instance.activate_import("held")  # at once, from the emit

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert engine.reserve_import(_import("held"))  # a block of four held
        for rid in ("big", "gone"):  # 50-token prompts: four blocks each, three free
            instance.submit(Request(rid, 0.0, 50, 4))
        instance.start(sink)
        loop.call_later(0.01, instance.abort, "gone")
        for _ in range(1_000):  # 10 simulated seconds: ample
            if len(ended) == 3:
                break
            await asyncio.sleep(0.01)
        await instance.stop()

    run(main(), virtual=True)
    assert ended == {"gone": RequestStatus.FINISHED_ABORTED,
                     "held": RequestStatus.FINISHED_LENGTH, "big": RequestStatus.FINISHED_LENGTH}


def test_a_finished_decode_run_leaves_no_reference_cycle():
    """A run holds the callback its timer calls, which holds the run: when the run ends both
    are let go, so its objects are freed by their reference counts, not left to the cyclic
    collector (whose passes over them cost ~10% of a 1,000-instance run: docs/performance.md)."""
    import gc

    from hfx.sim.driver import simulate

    config = SimConfig(workload="four-task", policy="rr", instances=2, qps=20.0,
                       requests_per_task=40)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        simulate(config)
        gc.collect()
        cyclic = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not cyclic & {"DecodeRun", "Timer", "partial"}, cyclic
