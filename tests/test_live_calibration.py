"""Calibrating the dispatcher's step-time model on what a gateway served (hfx serve
--calibrate-every): the replay recovers how much slower the engines decode than the profile,
the fit is applied to the dispatcher and /metrics, and what cannot be replayed is left out."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from hfx.assembly import build_cluster, sim_engines
from hfx.config import SimConfig
from hfx.evaluation.calibration import Calibration, ReplayEngine, Served, fit_served
from hfx.model.tokenizer import ByteTokenizer
from hfx.request import SLO, Outcome, Request, RequestRecord
from hfx.sampling import GREEDY
from hfx.serving import calibrator as calibrator_module
from hfx.serving.calibrator import MIN_REQUESTS, LiveCalibrator, served
from hfx.serving.metrics import Metrics
from hfx.serving.server import ServeOptions, Server
from hfx.sim.clock import run
from hfx.sim.driver import load_requests, resolve_profile, run_cluster

SLOW = 1.6  # the served engines decode this much slower than the dispatcher's profile
CONFIG = SimConfig(workload="four-task", policy="rr", instances=2, qps=8.0,
                   requests_per_task=30, planner="chunked", step_noise=0.0)
PROFILE = resolve_profile(CONFIG)
ENGINE = ReplayEngine("chunked", None, CONFIG.max_num_seqs, PROFILE.kv_capacity_tokens,
                      PROFILE.block_size)


def served_run(decode: float, delivery: float = 0.0) -> list[Served]:
    """Serve the workload on engines that decode ``decode``× the profile, each token seen
    ``delivery`` seconds late."""
    slow = replace(PROFILE, model=PROFILE.model.scaled(1.0, decode))
    control, _ = run(run_cluster(CONFIG, load_requests(CONFIG), slow), virtual=True)
    out = [s for s in map(served, control.records.values()) if s is not None]
    return [replace(s, ttft=s.ttft + delivery) for s in out]


@pytest.mark.parametrize("decode, delivery", [(SLOW, 0.1), (0.7, 0.0)])
def test_a_replay_of_what_was_served_recovers_the_decode_scale_and_delivery(decode, delivery):
    data = served_run(decode, delivery)
    assert len(data) == 120 and len({s.instance for s in data}) == 2
    fit = fit_served(PROFILE.model, data, ENGINE)
    assert fit.decode_scale == pytest.approx(decode, rel=0.02)
    assert fit.delivery == pytest.approx(delivery, abs=0.01)
    assert max(map(abs, fit.error)) <= 0.005


def test_the_replay_keeps_each_request_on_the_instance_that_served_it():
    # Both instances' requests moved onto one: its batches double, its TPOT grows, and the fit
    # of an exact profile is no longer 1 (so the per-instance replay is what makes it 1).
    data = served_run(1.0)
    assert fit_served(PROFILE.model, data, ENGINE).decode_scale == pytest.approx(1.0, abs=0.01)
    merged = [replace(s, instance=0) for s in data]
    assert fit_served(PROFILE.model, merged, ENGINE).decode_scale < 0.95


def record(**kw) -> RequestRecord:
    req = Request("r", 1.0, 10, 8, SLO(1.0, 0.1))
    rec = RequestRecord(req, dispatch_time=1.5, instance=3, outcome=Outcome.FINISHED)
    for t in (1.8, 1.9, 2.0):
        rec.token_times.append(t)
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def test_what_is_served_and_what_cannot_be_replayed():
    s = served(record())
    assert (s.instance, s.dispatched, s.prompt_len, s.output_len) == (3, 1.5, 10, 3)
    assert s.ttft == pytest.approx(0.3) and s.tpot == pytest.approx(0.1)
    assert s.slo == SLO(1.0, 0.1)
    assert served(record(outcome=Outcome.ABORTED)) is None
    assert served(record(decode_instance=4)) is None  # P/D: two instances
    assert served(record(retries=1)) is None  # resumed elsewhere after a failure
    assert served(record(dispatch_time=None)) is None
    one = record()
    del one.token_times[1:]
    assert served(one) is None  # no TPOT


def sim_server(every: float = 1e6) -> tuple[Server, LiveCalibrator]:
    """A gateway core over two simulated engines that decode SLOW× its profile; its
    calibrator fits every ``every`` seconds (by default: only when a test calls it)."""
    config = CONFIG.model_copy(update={"instances": 2})
    slow = replace(PROFILE, model=PROFILE.model.scaled(1.0, SLOW))
    control = build_cluster(config, PROFILE, sim_engines(slow))
    calibrator = LiveCalibrator(control, PROFILE.model, ENGINE, every)
    options = ServeOptions("m", 4096, SLO(10.0, 1.0), {}, 256)
    return Server(control, ByteTokenizer(), options, calibrator), calibrator


async def serve(server: Server, ids: range) -> None:
    """Streams of ``ids`` (a quarter second apart), each read to its end."""

    async def one(i: int) -> None:
        await asyncio.sleep(0.25 * (i - ids.start))
        stream = server.open("cmpl", "m", [1] * (20 + i % 50), 10 + i % 30, GREEDY,
                             server.resolve_slo(None, None, None, {}))
        async for _ in stream.events():
            pass

    await asyncio.gather(*(one(i) for i in ids))


def serve_and(server: Server, n: int, then=None):
    """On the virtual clock: start ``server``, serve ``n`` streams, await ``then()``, stop."""

    async def scenario():
        await server.start()
        await serve(server, range(n))
        out = await then() if then is not None else None
        await server.stop()
        return out

    return run(scenario(), virtual=True)


def test_a_gateway_applies_the_fit_to_its_dispatcher_and_reports_it():
    server, calibrator = sim_server()

    async def too_few_then_enough():
        assert len(calibrator.served) == MIN_REQUESTS - 1  # every ended stream was observed
        assert await calibrator.calibrate() is None  # too few: nothing fitted
        assert server.step_model == PROFILE.model and calibrator.rounds == 0
        await serve(server, range(MIN_REQUESTS - 1, 120))
        fit = await calibrator.calibrate()
        return fit, Metrics(server.control, calibrator).render().decode()

    fit, text = serve_and(server, MIN_REQUESTS - 1, too_few_then_enough)
    assert fit is not None and fit.decode_scale == pytest.approx(SLOW, rel=0.05)
    model = fit.apply(PROFILE.model)
    control = server.control
    assert server.step_model == model and control.step_model == model
    assert control._dispatch is not None and control._dispatch.view.step_model == model
    # The feasibility check reads the calibrated model: a TPOT between the profile's decode
    # step and the calibrated one is now refused.
    step = model.decode_time(21, 1)
    assert PROFILE.model.decode_time(21, 1) < 0.9 * step
    with pytest.raises(Exception, match="impossible SLO"):
        server.check_feasible(SLO(10.0, 0.9 * step), 20)
    assert f"hfx_step_model_decode_scale {fit.decode_scale}" in text
    assert "hfx_calibrations_total 1.0" in text
    # Nothing new since: no second fit.
    assert asyncio.run(calibrator.calibrate()) is None and calibrator.rounds == 1


def test_a_fit_out_of_range_is_not_applied(monkeypatch):
    server, calibrator = sim_server()
    serve_and(server, MIN_REQUESTS)
    monkeypatch.setattr(calibrator_module, "fit_served",
                        lambda *a: Calibration(20.0, 0.0, 1, (0.0, 0.0)))
    fit = asyncio.run(calibrator.calibrate())
    assert fit is not None and fit.decode_scale == 20.0
    assert calibrator.last is None and server.step_model == PROFILE.model
    assert calibrator.rounds == 1


def test_a_failing_fit_leaves_the_model_and_the_loop_running(monkeypatch, caplog):
    server, calibrator = sim_server(every=0.01)
    serve_and(server, MIN_REQUESTS)

    def broken(*a):
        raise RuntimeError("boom")

    monkeypatch.setattr(calibrator_module, "fit_served", broken)

    async def twice() -> None:
        calibrator.start()
        await asyncio.sleep(0.05)
        calibrator.new = MIN_REQUESTS  # as if more had been served meanwhile
        await asyncio.sleep(0.05)
        assert calibrator._task is not None and not calibrator._task.done()
        await calibrator.stop()

    asyncio.run(twice())
    assert caplog.text.count("calibrating the step-time model failed") == 2
    assert server.step_model == PROFILE.model
