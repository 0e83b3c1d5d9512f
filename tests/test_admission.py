"""Admission control (hfx/cluster/admission.py) and withdrawing queued requests from policies:
what is shed, when, from where, and that a withdrawn request is never dispatched."""

from __future__ import annotations

import asyncio

import pytest

from hfx.backends.local import LocalInstance
from hfx.cluster.admission import AdmissionLimits
from hfx.cluster.control import ControlPlane
from hfx.config import SimConfig
from hfx.engine import EngineConfig, EngineCore, Role, SimExecutor
from hfx.engine.stats import InstanceStats
from hfx.policies import POLICIES, ClusterView, InstanceView, make_policy
from hfx.policies.base import ArrivalOrderPolicy, Decision
from hfx.request import SLO, Outcome, Request
from hfx.sim.clock import run
from hfx.sim.driver import simulate
from hfx.stepmodel.latency import Profile, StepTimeModel

MODEL = StepTimeModel(0.01, 1e-5, 0.0, 0.01, 0.0, 1e-4)
PROFILE = Profile("test", MODEL, kv_capacity_tokens=8192)


class Holding(ArrivalOrderPolicy):
    """Dispatches nothing: every request stays queued."""

    name = "hold"

    def schedule(self, view: ClusterView) -> Decision:
        return Decision()


def cluster(policy, n: int = 1, **limits) -> ControlPlane:
    cfg = EngineConfig(num_kv_blocks=512, block_size=16)
    instances = [LocalInstance(i, EngineCore(cfg, SimExecutor(MODEL))) for i in range(n)]
    policy = make_policy(policy) if isinstance(policy, str) else policy
    return ControlPlane(instances, policy, PROFILE, admission=AdmissionLimits(**limits))


def req(rid: str, arrival: float = 0.0, prompt: int = 50, out: int = 10,
        slo: SLO | None = None) -> Request:
    return Request(rid, arrival, prompt, out, slo or SLO(1.0, 0.1))


def test_an_arrival_beyond_max_queued_is_shed_at_once():
    async def main():
        policy = Holding()
        cp = cluster(policy, max_queued=2)
        await cp.start()
        records = [cp.submit(req(f"r{i}")) for i in range(4)]
        queued = policy.num_queued()
        await cp.stop()
        return records, queued

    records, queued = run(main(), virtual=True)
    assert [r.outcome for r in records] == [Outcome.PENDING, Outcome.PENDING, Outcome.SHED,
                                            Outcome.SHED]
    assert "queue is full (2 requests waiting)" in records[2].error
    assert records[2].finish_time == 0.0 and queued == 2


def test_a_queued_request_is_shed_at_its_ttft_plus_max_wait_and_withdrawn():
    async def main():
        policy = Holding()
        cp = cluster(policy, max_wait=0.5)
        await cp.start()
        heard = []
        early = cp.submit(req("early", slo=SLO(1.0, 0.1)), heard.append)
        late = cp.submit(req("late", slo=SLO(3.0, 0.1)))
        await asyncio.sleep(2.0)
        between = early.outcome, late.outcome, policy.num_queued()
        await cp.wait_idle()
        await cp.stop()
        return early, late, between, heard

    early, late, between, heard = run(main(), virtual=True)
    assert between == (Outcome.SHED, Outcome.PENDING, 1)  # withdrawn from the policy's queue
    assert early.finish_time == pytest.approx(1.5) and late.finish_time == pytest.approx(3.5)
    assert early.error == "no first token 0.5 s past the TTFT SLO"
    assert [(e.token, e.finish_reason) for e in heard] == [(None, "error")]


def test_a_request_waiting_inside_an_instance_is_shed_and_its_kv_freed():
    async def main():
        cp = cluster("rr", max_wait=0.0)
        engine = cp.instances[0].engine
        await cp.start()
        # A long prefill (70 ms) holds the engine; the second request waits behind it inside
        # the instance, past its TTFT, and is shed there.
        busy = cp.submit(req("busy", prompt=6000, out=5, slo=SLO(60.0, 1.0)))
        await asyncio.sleep(0.001)
        waiting = cp.submit(req("waiting", 0.001, prompt=2000, out=5, slo=SLO(0.02, 1.0)))
        await cp.wait_idle()
        await cp.stop()
        return busy, waiting, engine

    busy, waiting, engine = run(main(), virtual=True)
    assert waiting.instance == 0 and waiting.num_tokens == 0
    assert waiting.outcome is Outcome.SHED and waiting.error.startswith("no first token")
    assert busy.outcome is Outcome.FINISHED and busy.num_tokens == 5
    assert engine.kv.num_used_blocks == 0 and not engine.state.waiting


def test_a_request_with_its_first_token_in_time_is_never_shed():
    async def main():
        cp = cluster("rr", max_wait=0.0, max_queued=1)
        await cp.start()
        # rr dispatches at once: nothing is queued when the next one arrives.
        records = [cp.submit(req(f"r{i}", out=200, slo=SLO(1.0, 0.1))) for i in range(3)]
        await cp.wait_idle()
        await cp.stop()
        return records

    records = run(main(), virtual=True)
    assert [r.outcome for r in records] == [Outcome.FINISHED] * 3
    assert all(r.num_tokens == 200 for r in records)


def test_aborting_a_queued_request_withdraws_it_from_the_policy():
    """It used to stay queued and later be 'dispatched' into the policy's shadow, where it
    held a slot and KV forever."""
    async def main():
        policy = make_policy("hfx")
        cp = cluster(policy)
        await cp.start()
        # HFX holds a request whose TTFT is lost in its best-effort tier while feasible ones
        # wait; an abort takes it out of whichever queue holds it.
        for i in range(40):
            cp.submit(req(f"r{i}", prompt=3000, out=50, slo=SLO(0.5, 0.1)))
        queued = policy.num_queued()
        cp.abort("r39")
        after = policy.num_queued()
        await cp.wait_idle()
        await cp.stop()
        return queued, after, policy, cp.records

    queued, after, policy, records = run(main(), virtual=True)
    assert queued > 0 and after == queued - 1
    assert records["r39"].outcome is Outcome.ABORTED and records["r39"].instance is None
    assert policy.shadow[0].inflight == {}  # nothing left behind in the dispatcher's shadow


def stats(now: float, i: int) -> InstanceStats:
    return InstanceStats(i, Role.COLOCATED, now, 0, 0, 0, 0, 0, 500, 16, 0, 256, 0.0, 0)


def idle_view(now: float, n: int = 2) -> ClusterView:
    return ClusterView(now, [InstanceView(i, Role.COLOCATED, stats(now, i)) for i in range(n)],
                       MODEL, PROFILE)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_withdraws_a_queued_request_and_never_dispatches_it(name):
    """After each decision, the newest request still queued — wherever the policy keeps it by
    then (an arrival queue, SA's per-instance sets, SCORPIO's heaps, HFX's best-effort tier) —
    is withdrawn, and is never dispatched afterwards."""
    policy = make_policy(name, **({"iterations": 5} if name == "sa" else {}))
    queued: list[str] = []
    withdrawn: set[str] = set()
    seen: set[str] = set()

    def arrive(prefix: str, ttft: float) -> None:
        # 8,000 KV tokens per instance: a few 1,500-token prompts fit, the rest wait.
        for i in range(10):
            r = Request(f"{prefix}{i}", 0.0, 1500, 20, SLO(ttft, 0.1))
            policy.enqueue(r, 0.0)
            queued.append(r.id)

    def withdraw_newest() -> None:
        if queued:
            assert policy.withdraw(queued[-1]) and not policy.withdraw(queued[-1])
            withdrawn.add(queued.pop())
            assert policy.num_queued() == len(queued)

    def decide(now: float) -> None:
        d = policy.schedule(idle_view(now))
        placed = {x.request.id for x in d.dispatch} | {r.id for r in d.reject}
        seen.update(placed)
        queued[:] = [q for q in queued if q not in placed]
        assert policy.num_queued() == len(queued)
        withdraw_newest()

    arrive("a", 5.0)
    withdraw_newest()
    assert not policy.withdraw("unknown")
    decide(0.0)
    arrive("b", 0.05)  # lost by t = 1: HFX moves these to its best-effort tier
    decide(0.0)
    for t in range(2, 200):
        decide(t * 0.5)
    assert withdrawn and not withdrawn & seen


def test_simulated_runs_count_shed_requests():
    base = dict(policy="hfx", workload="two-task", qps=400, requests_per_task=100)
    unbounded = simulate(SimConfig(**base))
    bounded = simulate(SimConfig(**base, max_wait=0.5, max_queued=50))
    assert unbounded["shed"] == 0
    assert bounded["shed"] > 0
    assert bounded["finished"] + bounded["shed"] + bounded["rejected"] == 200
    assert bounded["ttft"]["p99"] < unbounded["ttft"]["p99"]
