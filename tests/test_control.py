"""The control plane with baseline policies on the virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hfx.backends.local import LocalInstance
from hfx.cluster.control import ControlPlane
from hfx.cluster.monitor import Monitor
from hfx.cluster.slo_mapper import PriorityMapper, PriorityRange
from hfx.cluster.tl_manager import TLManager
from hfx.engine import EngineConfig, EngineCore, Role, SimExecutor
from hfx.policies import make_pd_policies, make_policy
from hfx.policies.base import ArrivalOrderPolicy, Decision
from hfx.request import SLO, Outcome, Request, RequestRecord
from hfx.sim.clock import run
from hfx.stepmodel.latency import Profile, StepTimeModel

MODEL = StepTimeModel(0.01, 1e-5, 0.0, 0.01, 0.0, 1e-4)
PROFILE = Profile("test", MODEL, kv_capacity_tokens=8192)


def cluster(policy: str, n: int = 3, **kw) -> ControlPlane:
    cfg = EngineConfig(num_kv_blocks=512, block_size=16)
    instances = [LocalInstance(i, EngineCore(cfg, SimExecutor(MODEL))) for i in range(n)]
    return ControlPlane(instances, make_policy(policy), PROFILE, **kw)


SLO_DEFAULT = SLO(1.0, 0.1)


def req(i: int, prompt: int = 50, out: int = 10, slo: SLO | None = SLO_DEFAULT) -> Request:
    return Request(f"r{i}", arrival=0.0, prompt_len=prompt, max_tokens=out, slo=slo)


def test_round_robin_cycles_instances():
    async def main():
        cp = cluster("rr")
        await cp.start()
        for i in range(7):
            cp.submit(req(i))
        await cp.wait_idle()
        await cp.stop()
        return [cp.records[f"r{i}"].instance for i in range(7)]

    assert run(main(), virtual=True) == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_avoids_the_busy_instance():
    async def main():
        cp = cluster("least-loaded", n=2)
        await cp.start()
        cp.submit(req(0, prompt=2000, out=200))  # heavy, on instance 0
        cp.submit(req(1))
        cp.submit(req(2))
        cp.submit(req(3))
        await cp.wait_idle()
        await cp.stop()
        return [cp.records[f"r{i}"].instance for i in range(4)]

    assert run(main(), virtual=True) == [0, 1, 1, 1]


def test_abort_in_flight_and_request_without_slo():
    async def main():
        cp = cluster("rr", n=1)
        await cp.start()
        long = cp.submit(req(0, out=1000))
        short = cp.submit(req(1, out=5))
        no_slo = cp.submit(req(2, slo=None))
        await asyncio.sleep(0.5)
        cp.abort("r0")
        await cp.wait_idle()
        await cp.stop()
        return long, short, no_slo, cp

    long, short, no_slo, cp = run(main(), virtual=True)
    assert long.outcome is Outcome.ABORTED and 0 < long.num_tokens < 1000
    assert short.outcome is Outcome.FINISHED and short.num_tokens == 5
    assert no_slo.outcome is Outcome.REJECTED and "no SLO" in no_slo.error
    engine = cp.instances[0].engine
    assert engine.kv.num_used_blocks == 0 and not engine.has_work()
    assert cp.num_done == 3


def test_duplicate_request_id_is_refused():
    async def main():
        cp = cluster("rr", n=1)
        await cp.start()
        cp.submit(req(0))
        with pytest.raises(ValueError, match="duplicate"):
            cp.submit(req(0))
        await cp.wait_idle()
        await cp.stop()

    run(main(), virtual=True)


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="rr, least-loaded"):
        make_policy("nope")


class BreakingExecutor(SimExecutor):
    """Runs like the simulator until step ``breaks_at``. Then, ``raise``: the step raises (a
    device fault or a bug, which the engine cannot tell from a bad request); ``die``: the
    instance dies mid-step, as a killed process does (its step never returns)."""

    # It counts ``execute`` calls, one per step: no decode runs, which take several steps
    # without calling it (hfx/engine/decode_run.py).
    advances_runs = False

    def __init__(self, model: StepTimeModel, breaks_at: int, how: str = "raise") -> None:
        super().__init__(model)
        self.steps, self.breaks_at, self.how = 0, breaks_at, how
        self.instance: LocalInstance | None = None
        self.before_break: Callable[[], None] | None = None

    async def execute(self, out):
        self.steps += 1
        if self.steps == self.breaks_at:
            if self.before_break is not None:
                self.before_break()
            if self.how == "raise":
                raise RuntimeError("device lost")
            assert self.instance is not None
            self.instance._fail(f"instance {self.instance.id} failed: process died")
            await asyncio.Event().wait()  # never returns
        return await super().execute(out)


def _break_one_of_two(max_retries: int, how: str = "raise", abort_first: str | None = None):
    """Four requests round-robin over two instances; instance 0 breaks on its third step, a
    decode step of r0 and r2, which have streamed tokens by then; r9 arrives after it."""
    async def main():
        cfg = EngineConfig(num_kv_blocks=512, block_size=16)
        breaking = BreakingExecutor(MODEL, breaks_at=3, how=how)
        instances = [LocalInstance(0, EngineCore(cfg, breaking)),
                     LocalInstance(1, EngineCore(cfg, SimExecutor(MODEL)))]
        breaking.instance = instances[0]
        cp = ControlPlane(instances, make_policy("rr"), PROFILE, max_retries=max_retries)
        if abort_first is not None:  # aborted just before the instance breaks
            breaking.before_break = lambda: cp.abort(abort_first)
        await cp.start()
        heard: dict[str, list] = {}
        for i in range(4):
            heard[f"r{i}"] = []
            cp.submit(req(i), heard[f"r{i}"].append)
        await asyncio.sleep(1.0)
        cp.submit(req(9))  # after the failure: must go to the healthy instance
        await asyncio.wait_for(cp.wait_idle(), 60)
        await cp.stop()
        return cp, heard

    return run(main(), virtual=True)


@pytest.mark.parametrize(("how", "max_retries"), [("die", 0), ("raise", 1)])
def test_a_broken_instance_fails_its_requests_clearly_and_takes_no_more(how, max_retries):
    """Without retries, or when they were in the step that raised (suspects: either may have
    caused it, and a request that broke one instance is never sent to break another)."""
    cp, heard = _break_one_of_two(max_retries, how)
    for i in (0, 2):  # round robin put these on instance 0
        rec = cp.records[f"r{i}"]
        assert rec.outcome is Outcome.FAILED and rec.retries == 0
        assert ("device lost" if how == "raise" else "process died") in rec.error
        assert heard[f"r{i}"][-1].finish_reason == "error"
    for i in (1, 3, 9):
        assert cp.records[f"r{i}"].outcome is Outcome.FINISHED
    assert cp.records["r9"].instance == 1
    assert 0 not in cp.instances and 0 in cp.retired  # released after failing
    assert cp.num_instance_failures == 1


def test_a_request_aborted_as_its_instance_dies_ends_aborted_and_is_not_resumed():
    """The abort had not landed when the instance died: what the client left is not served
    on another instance (issue 28's review: it was, and ended "finished")."""
    cp, heard = _break_one_of_two(max_retries=1, how="die", abort_first="r0")
    r0, r2 = cp.records["r0"], cp.records["r2"]
    assert r0.outcome is Outcome.ABORTED and r0.retries == 0
    assert heard["r0"][-1].finish_reason == "abort"
    assert r2.outcome is Outcome.FINISHED and r2.retries == 1  # the other one resumed
    assert cp.num_resumed == 1


def test_a_dead_instances_requests_resume_elsewhere_with_every_token():
    cp, heard = _break_one_of_two(max_retries=1, how="die")
    for i in (0, 2):
        rec = cp.records[f"r{i}"]
        assert rec.outcome is Outcome.FINISHED and rec.retries == 1 and rec.instance == 1
        # Tokens streamed before the failure count once; the rest came from instance 1.
        assert rec.num_tokens == rec.request.max_tokens
        assert [e.token is not None for e in heard[f"r{i}"]] == [True] * 10 + [False]
        assert heard[f"r{i}"][-1].finish_reason == "length"
    assert all(cp.records[f"r{i}"].outcome is Outcome.FINISHED for i in (1, 3, 9))
    assert 0 in cp.retired
    assert (cp.num_instance_failures, cp.num_resumed) == (1, 2)


class PoisonExecutor(SimExecutor):
    """Raises on any step that contains request ``poison`` (a request that breaks a step)."""

    async def execute(self, out):
        if any(s.request_id == "poison" for s in out.num_scheduled_tokens):
            raise ValueError("probability tensor contains nan")
        return await super().execute(out)


def test_a_request_whose_step_raises_alone_fails_alone_and_the_instance_goes_on():
    async def main():
        cfg = EngineConfig(num_kv_blocks=512, block_size=16)
        cp = ControlPlane([LocalInstance(0, EngineCore(cfg, PoisonExecutor(MODEL)))],
                          make_policy("rr"), PROFILE)
        await cp.start()
        heard: list = []
        cp.submit(Request("poison", 0.0, 50, 10, SLO_DEFAULT), heard.append)
        await asyncio.sleep(0.5)
        cp.submit(Request("fine", asyncio.get_running_loop().time(), 50, 10, SLO_DEFAULT))
        await asyncio.wait_for(cp.wait_idle(), 60)
        await cp.stop()
        return cp, heard

    cp, heard = run(main(), virtual=True)
    poison, fine = cp.records["poison"], cp.records["fine"]
    assert poison.outcome is Outcome.FAILED and "probability tensor" in poison.error
    assert [(e.token, e.finish_reason) for e in heard] == [(None, "error")]
    assert fine.outcome is Outcome.FINISHED and fine.instance == 0
    assert cp.num_instance_failures == 0 and 0 in cp.instances
    assert cp.instances[0].engine.kv.num_used_blocks == 0


class HoldingPolicy(ArrivalOrderPolicy):
    """Dispatches nothing; remembers what each call saw."""

    name = "hold"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[float, list[float]]] = []

    def schedule(self, view):
        self.calls.append((view.now, [v.stats.time for v in view.instances]))
        return Decision()


def test_monitor_snapshots_reach_the_policy_every_interval():
    async def main():
        cfg = EngineConfig(num_kv_blocks=512, block_size=16)
        policy = HoldingPolicy()
        cp = ControlPlane([LocalInstance(i, EngineCore(cfg, SimExecutor(MODEL)))
                           for i in range(2)], policy, PROFILE, monitor=Monitor(0.5))
        await cp.start()
        cp.submit(req(0))  # queued work: each snapshot calls the policy
        await asyncio.sleep(1.6)
        await cp.stop()
        return policy.calls

    calls = run(main(), virtual=True)
    # The arrival, then a snapshot every 0.5 s, each seen with that snapshot's stats.
    assert calls == [(0.0, [0.0, 0.0]), (0.5, [0.5, 0.5]), (1.0, [1.0, 1.0]),
                     (1.5, [1.5, 1.5])]


def test_priority_slo_is_clamped_while_a_higher_priority_waits_for_its_first_token():
    """HFX-PM's contention rule (HyperFlexis §5.2, our reading): with a more important request
    still without its first token, a priority's SLO keeps its own lower bound; otherwise the
    bound relaxes to the strictest priority's."""
    ranges = [PriorityRange.around(SLO(0.2, 0.02)), PriorityRange.around(SLO(2.0, 0.2))]

    async def main():
        mapper = PriorityMapper(ranges)
        for _ in range(10):  # recent completions far faster than either range
            mapper.observe(1, ttft=0.01, queue_time=0.0, tpot=0.001)
        cp = cluster("rr", n=2, mapper=mapper)
        await cp.start()
        alone = cp.submit(Request("a", 0.0, 50, 10, None, priority=1)).slo
        await cp.wait_idle()
        now = asyncio.get_running_loop().time()
        cp.submit(Request("p0", now, 4000, 10, None, priority=0))  # a long prefill
        contended = cp.submit(Request("b", now, 50, 10, None, priority=1)).slo
        await cp.wait_idle()
        after = cp.submit(Request("c", asyncio.get_running_loop().time(), 50, 10, None,
                                  priority=1)).slo
        await cp.wait_idle()
        await cp.stop()
        return alone, contended, after

    alone, contended, after = run(main(), virtual=True)
    assert alone == SLO(ranges[0].lo.ttft, ranges[0].lo.tpot)  # relaxed to the strictest
    assert contended == SLO(ranges[1].lo.ttft, ranges[1].lo.tpot)  # its own bound
    assert after == alone  # p0 got its first token: relaxed again


def _serve_past_a_death(build: Callable[[], ControlPlane], first: list[Request],
                        late: Request) -> tuple[ControlPlane, RequestRecord]:
    """Start the control plane ``build`` makes, submit ``first``, then ``late`` 1 s on (after
    the instance its BreakingExecutor kills has died), and run until nothing is pending."""
    async def main():
        cp = build()
        await cp.start()
        for r in first:
            cp.submit(r)
        await asyncio.sleep(1.0)
        record = cp.submit(late)
        await asyncio.wait_for(cp.wait_idle(), 60)  # nothing hangs
        await cp.stop()
        return cp, record

    return run(main(), virtual=True)


def test_with_no_instance_left_queued_and_new_requests_fail_at_once_with_the_reason():
    """Issue 16: a fleet that lost its last instance, with no Scaler to replace it, does not
    let requests wait forever."""
    def build() -> ControlPlane:
        cfg = EngineConfig(num_kv_blocks=512, block_size=16)
        breaking = BreakingExecutor(MODEL, breaks_at=3, how="die")
        instance = LocalInstance(0, EngineCore(cfg, breaking))
        breaking.instance = instance
        return ControlPlane([instance], make_policy("rr"), PROFILE)

    cp, late = _serve_past_a_death(build, [req(0), req(1)], req(2))
    for i in (0, 1):  # resumable, but nowhere to go
        rec = cp.records[f"r{i}"]
        assert rec.outcome is Outcome.FAILED and rec.retries == 1
        assert rec.error == "no instance can serve: instance 0 failed: process died"
    assert late.outcome is Outcome.FAILED and late.finish_time == late.request.arrival
    assert cp.serviceable() == "instance 0 failed: process died"
    assert cp.policy.num_queued() == 0  # the queue gauge: nothing left behind (issue 50)


def test_pd_with_no_decode_instance_left_prefilled_and_new_requests_fail_clearly():
    """P/D, 1 prefill + 1 decode, the decode instance dies: what it decoded fails (a request
    with a first token does not resume in P/D), and so do the prefilled requests waiting for
    decode KV (5 of 8 prompts of 1,500 tokens fit its 8,192) — aborted where their KV is held —
    and every later one, at once. Before, the prefilled ones waited for a decode instance that
    would never come."""
    from hfx.assembly import build_cluster
    from hfx.config import SimConfig
    from hfx.engine import Role

    dying: list[BreakingExecutor] = []

    def make(ecfg: EngineConfig) -> EngineCore:
        if ecfg.role is Role.DECODE:
            dying.append(BreakingExecutor(MODEL, breaks_at=4, how="die"))
            return EngineCore(ecfg, dying[-1])
        return EngineCore(ecfg, SimExecutor(MODEL))

    def build() -> ControlPlane:
        cfg = SimConfig(mode="pd", prefill=1, decode=1, policy="rr-pd", kv_bytes_per_token=1000)
        cp = build_cluster(cfg, PROFILE, make)
        dying[0].instance = cp.instances[1]
        return cp

    cp, late = _serve_past_a_death(build, [req(i, prompt=1500, out=40) for i in range(8)],
                                   req(9))
    records = [cp.records[f"r{i}"] for i in range(8)]
    assert {r.outcome for r in records} == {Outcome.FAILED}
    decoded = [r for r in records if r.decode_instance == 1 and r.migrated_at is not None]
    waiting = [r for r in records if r.migrated_at is None]
    assert (len(decoded), len(waiting)) == (5, 3)
    assert all(r.error == "instance 1 failed: process died" for r in decoded)
    assert all(r.error == "no instance can serve: instance 1 failed: process died"
               and r.num_tokens == 1 for r in waiting)
    assert late.outcome is Outcome.FAILED and late.finish_time == late.request.arrival
    assert cp.instances[0].engine.kv.num_used_blocks == 0  # the held KV was freed


@pytest.mark.parametrize("policy", ["polyserve", "hfx", "rr"])
def test_a_request_no_instance_can_ever_hold_fails_at_once_and_the_rest_go_on(policy):
    # 512 blocks of 16 = 8,192 tokens of KV per instance. PolyServe and HFX hold a request
    # until an instance has room for it: one that needs 9,000 tokens would wait forever (the
    # simulation stalled on it) unless the control plane refuses it at submit.
    async def main():
        cp = cluster(policy, n=2)
        await cp.start()
        cp.submit(req(0))
        cp.submit(req(1, prompt=8990, out=10))
        cp.submit(req(2))
        await asyncio.wait_for(cp.wait_idle(), timeout=60)
        await cp.stop()
        return cp.records

    records = run(main(), virtual=True)
    big = records["r1"]
    assert big.outcome is Outcome.FAILED and big.instance is None
    assert big.finish_time == 0.0 and "exceeds the KV cache (8192 tokens)" in big.error
    assert [records[r].outcome for r in ("r0", "r2")] == [Outcome.FINISHED] * 2


def test_in_pd_a_request_the_decode_stage_can_never_hold_fails_at_submit():
    # Prefill instances hold 8,192 tokens of KV, the decode instance 1,024: a 2,000-token
    # request would prefill and then wait for the Migrator forever.
    def instance(i: int, role: Role, blocks: int) -> LocalInstance:
        cfg = EngineConfig(num_kv_blocks=blocks, block_size=16, role=role)
        return LocalInstance(i, EngineCore(cfg, SimExecutor(MODEL)))

    async def main():
        dispatcher, migrator = make_pd_policies("rr-pd")
        cp = ControlPlane([instance(0, Role.PREFILL, 512), instance(1, Role.DECODE, 64)],
                          dispatcher, PROFILE, migrator=migrator, tl_manager=TLManager(1024))
        await cp.start()
        cp.submit(req(0))
        cp.submit(req(1, prompt=1990, out=10))
        await asyncio.wait_for(cp.wait_idle(), timeout=60)
        await cp.stop()
        return cp.records

    records = run(main(), virtual=True)
    assert records["r1"].outcome is Outcome.FAILED and records["r1"].instance is None
    assert "exceeds the KV cache (1024 tokens)" in records["r1"].error
    assert records["r0"].outcome is Outcome.FINISHED


@pytest.mark.parametrize(("mode", "planner", "engine_planner", "mixed"), [
    ("colocated", None, None, True),  # hfx brings deadline-chunked: its prefill steps decode too
    ("colocated", "prefill-first", None, False),
    ("colocated", "chunked", None, True),
    ("pd", "prefill-first", None, False),
    ("pd", "chunked", None, True),
    # Engines that are not ours: the planner that stands for them (vLLM's scheduler), whatever
    # planner is configured.
    ("colocated", "prefill-first", "chunked", True),
])
def test_the_dispatchers_learn_whether_the_engines_mix_prefill_and_decode(
        mode, planner, engine_planner, mixed):
    from hfx.assembly import build_cluster
    from hfx.config import SimConfig

    cfg = SimConfig(policy="hfx", mode=mode, planner=planner, instances=2, prefill=1, decode=1,
                    kv_bytes_per_token=1024)
    cp = build_cluster(cfg, PROFILE, engine_planner=engine_planner)
    assert cp.mixed_steps is mixed

    async def views() -> list[bool]:
        await cp.start()
        try:
            stages = [cp._dispatch] + ([cp.migration.stage] if cp.migration else [])
            return [stage.view.mixed_steps for stage in stages]
        finally:
            await cp.stop()

    assert set(run(views(), virtual=True)) == {mixed}
