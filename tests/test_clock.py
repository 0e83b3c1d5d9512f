"""The virtual-time loop, and the same serving code on both clocks."""

from __future__ import annotations

import asyncio
import time

import pytest

from hfx.config import SimConfig
from hfx.request import SLO, Outcome, Request
from hfx.sim.clock import SimulationDeadlock, VirtualTimeLoop, run
from hfx.sim.driver import run_cluster
from hfx.stepmodel.latency import Profile, StepTimeModel


def test_virtual_time_jumps_to_the_next_timer():
    async def main():
        loop = asyncio.get_running_loop()
        order = []

        async def sleeper(d):
            await asyncio.sleep(d)
            order.append((d, loop.time()))

        t0 = time.perf_counter()
        await asyncio.gather(sleeper(3600.0), sleeper(0.5), sleeper(60.0))
        return order, time.perf_counter() - t0

    order, wall = run(main(), virtual=True)
    assert order == [(0.5, 0.5), (60.0, 60.0), (3600.0, 3600.0)]
    assert wall < 1.0  # an hour of virtual time, no real waiting


def test_a_timer_fires_at_its_own_time_exactly():
    """Each callback reads the time it was set for, to the bit: the clock jumps to a timer's
    time (not now + the difference), and a timer a nanosecond behind another does not fire
    with it, early (decode runs compute step ends as start + duration: decode_run.py)."""
    start, step = 0.1, 0.0123456789
    whens = [start + step, start + step + 1e-10, start + step + 4e-10, 7.0 + 1e-9]

    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(start)
        seen: list[tuple[float, float]] = []
        for when in whens:
            loop.call_at(when, lambda w=when: seen.append((w, loop.time())))
        await asyncio.sleep(10.0)
        return seen

    seen = run(main(), virtual=True)
    assert [w for w, _ in seen] == whens
    assert all(now == when for when, now in seen), seen


def test_a_task_waiting_forever_is_a_deadlock_not_a_hang():
    async def main():
        await asyncio.Event().wait()

    with pytest.raises(SimulationDeadlock):
        run(main(), virtual=True)


def test_loop_starts_at_given_time():
    loop = VirtualTimeLoop(start=100.0)
    try:
        assert loop.run_until_complete(asyncio.sleep(1.5, result=loop.time())) == 100.0
        assert loop.time() == 101.5
    finally:
        loop.close()


def _tiny_cluster_run(virtual: bool):
    # Millisecond steps so that the real-time run takes a fraction of a second.
    model = StepTimeModel(1e-3, 1e-6, 0.0, 1e-3, 0.0, 1e-5)
    profile = Profile("tiny", model, kv_capacity_tokens=4096)
    requests = [Request(f"r{i}", arrival=0.01 * i, prompt_len=20 + 7 * i, max_tokens=5 + i,
                        slo=SLO(1.0, 0.5)) for i in range(8)]
    config = SimConfig(instances=2, policy="least-loaded", monitor_interval=0.05)
    control, _ = run(run_cluster(config, requests, profile), virtual=virtual)
    return {rid: (r.outcome, r.num_tokens, r.instance) for rid, r in control.records.items()}


def test_same_engine_code_on_real_and_virtual_loops():
    real = _tiny_cluster_run(virtual=False)
    sim = _tiny_cluster_run(virtual=True)
    assert {k: v[:2] for k, v in real.items()} == {k: v[:2] for k, v in sim.items()}
    assert all(o is Outcome.FINISHED and n == 5 + int(k[1:]) for k, (o, n, _) in sim.items())


def test_timers_due_at_one_instant_fire_in_the_order_they_were_set():
    """Ties fire first-set first, whatever else is pending: asyncio's own heap leaves their
    order to the heap's shape, so a run would depend on how many other timers there were."""
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        for i in range(300):
            loop.call_at(1.0 + (i % 7) * 0.25, fired.append, i)  # seven instants, interleaved
        await asyncio.sleep(5.0)
        return fired

    fired = run(main(), virtual=True)
    assert fired == sorted(range(300), key=lambda i: (i % 7, i))


def test_cancelled_timers_do_not_fire_nor_pile_up():
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        most = 0
        for i in range(20_000):  # a timer set and cancelled per step, as a cut decode run's
            keep = loop.call_at(loop.time() + 100.0, fired.append, i)
            if i % 100:
                keep.cancel()
            await asyncio.sleep(0.001)
            most = max(most, len(loop._scheduled))  # type: ignore[attr-defined]
        await asyncio.sleep(200.0)
        return fired, most

    fired, most = run(main(), virtual=True)
    assert fired == list(range(0, 20_000, 100))
    assert most < 600  # ~200 live timers at once; the 19,800 cancelled ones purged


def test_a_timer_set_in_the_past_fires_now_and_time_never_goes_back():
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(10.0)
        seen: list[float] = []
        loop.call_at(9.0, lambda: seen.append(loop.time()))  # a deadline already passed
        loop.call_later(-1.0, lambda: seen.append(loop.time()))
        await asyncio.sleep(1.0)
        seen.append(loop.time())
        return seen

    assert run(main(), virtual=True) == [10.0, 10.0, 11.0]


def test_a_failing_callback_goes_to_the_exception_handler_and_the_loop_goes_on():
    """As asyncio's ``Handle._run``: the loop's handler gets asyncio's message, the exception
    and the handle; the timers after it still fire."""
    loop = VirtualTimeLoop()
    caught: list[dict] = []
    loop.set_exception_handler(lambda _, context: caught.append(context))
    fired: list[float] = []

    def fail() -> None:
        raise ValueError("bad step")

    try:
        bad = loop.call_at(1.0, fail)
        loop.call_at(2.0, lambda: fired.append(loop.time()))
        loop.run_until_complete(asyncio.sleep(3.0))
    finally:
        loop.close()
    assert [type(c["exception"]) for c in caught] == [ValueError]
    assert caught[0]["handle"] is bad
    assert caught[0]["message"].startswith("Exception in callback ")
    assert "fail" in caught[0]["message"]
    assert fired == [2.0]


def test_a_timer_answers_as_asyncios_handle():
    """``call_at`` returns a handle that answers as asyncio's ``TimerHandle``: its time, its
    cancel; ``call_later`` works on it; a debug loop's records where it was set; a closed loop
    refuses a timer."""
    loop = VirtualTimeLoop(start=5.0)
    try:
        handle = loop.call_at(7.5, print, "x")
        assert handle.when() == 7.5 and not handle.cancelled()
        handle.cancel()
        assert handle.cancelled()
        assert loop.call_later(2.0, print).when() == 7.0
        loop.set_debug(True)
        assert loop.call_at(8.0, print)._source_traceback  # type: ignore[attr-defined]
    finally:
        loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_at(9.0, print)


def test_stop_ends_run_forever_after_the_iteration_and_the_loop_resumes():
    loop = VirtualTimeLoop()
    fired: list[float] = []
    try:
        loop.call_at(1.0, loop.stop)
        loop.call_at(1.0, lambda: fired.append(loop.time()))  # same iteration: still runs
        loop.call_at(2.0, lambda: fired.append(loop.time()))
        loop.call_at(3.0, loop.stop)
        loop.run_forever()
        assert fired == [1.0]
        loop.run_forever()
        assert fired == [1.0, 2.0] and loop.time() == 3.0
    finally:
        loop.close()
