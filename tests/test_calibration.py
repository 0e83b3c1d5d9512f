"""Calibrating the step-time model on a served run: the fit recovers the scales that made it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hfx.config import SimConfig
from hfx.evaluation.calibration import fit_calibration
from hfx.sim.clock import run
from hfx.sim.driver import load_requests, resolve_profile, run_cluster
from hfx.stepmodel.latency import StepTimeModel

CONFIG = SimConfig(workload="four-task", policy="rr", instances=1, qps=4.0,
                   requests_per_task=40, planner="chunked", step_noise=0.0)


def means(model: StepTimeModel) -> tuple[float, float]:
    profile = replace(resolve_profile(CONFIG), model=model)
    control, _ = run(run_cluster(CONFIG, load_requests(CONFIG), profile), virtual=True)
    done = list(control.records.values())
    return (float(np.mean([r.ttft for r in done])), float(np.mean([r.tpot for r in done])))


@pytest.mark.parametrize("decode, delivery", [(2.4, 0.15), (1.5, 0.0), (0.8, 0.3)])
def test_the_fit_recovers_the_decode_scale_and_delivery_of_a_server(decode, delivery):
    model = resolve_profile(CONFIG).model
    # The "served" run: decodes this much slower than the profile says, every token seen
    # ``delivery`` seconds after its step.
    ttft, real_tpot = means(model.scaled(1.0, decode))
    real_ttft = ttft + delivery
    fit = fit_calibration(model, means, real_ttft, real_tpot)
    # A mean moves in steps with the scale (batch boundaries), hence a few percent.
    assert fit.decode_scale == pytest.approx(decode, rel=0.03)
    assert fit.delivery == pytest.approx(delivery, abs=0.01)
    assert max(abs(e) for e in fit.error) <= 0.005
    assert 2 <= fit.rounds <= 12
    ttft, tpot = means(fit.apply(model))
    assert (ttft + fit.delivery - real_ttft) / real_ttft == pytest.approx(fit.error[0])
    assert (tpot - real_tpot) / real_tpot == pytest.approx(fit.error[1])


def test_a_profile_that_is_right_needs_one_round():
    model = resolve_profile(CONFIG).model
    fit = fit_calibration(model, means, *means(model))
    assert (fit.decode_scale, fit.delivery, fit.rounds, fit.error) == (1.0, 0.0, 1, (0, 0))


def test_a_simulator_slower_than_the_server_gets_no_negative_delivery():
    model = resolve_profile(CONFIG).model
    ttft, tpot = means(model)
    fit = fit_calibration(model, means, ttft * 0.5, tpot)
    assert fit.delivery == 0.0 and fit.error[0] == pytest.approx(1.0)


def test_scaled_scales_each_equation_by_its_own_factor():
    m = StepTimeModel(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert m.scaled(2.0, 10.0) == StepTimeModel(2.0, 4.0, 6.0, 40.0, 50.0, 60.0)
    assert m.scaled(3.0) == StepTimeModel(3.0, 6.0, 9.0, 12.0, 15.0, 18.0)


def test_a_real_mean_of_zero_is_refused():
    with pytest.raises(ValueError, match="positive"):
        fit_calibration(StepTimeModel(1, 1, 1, 1, 1, 1), means, 0.0, 0.1)


def test_a_fit_that_does_not_converge_returns_its_closest_round():
    # A simulator whose TPOT jumps around the target whatever the scale: the fit keeps the
    # round that came closest (round 2), not the last one.
    answers = iter([(0.5, 1.1), (0.4, 0.99), (0.6, 1.05), (0.5, 0.97)])
    fit = fit_calibration(StepTimeModel(1, 1, 1, 1, 1, 1), lambda m: next(answers), 1.0, 1.0,
                     max_rounds=4)
    assert fit.rounds == 4
    assert fit.error == pytest.approx((0.0, -0.01))
    assert fit.decode_scale == pytest.approx(1 / 1.1)
    assert fit.delivery == pytest.approx(0.6)
