"""The pacing arithmetic HFX's planners and HFX's scheduler inside vLLM share
(hfx/engine/planners/pacing.py): a step's predicted time, and the measured pace that scales it."""

from __future__ import annotations

import pytest

from hfx.engine.planners.pacing import PACE_WEIGHT, StepPace, step_time, time2bs
from hfx.stepmodel.latency import StepTimeModel

# Eq. 1/2: a 10 ms floor, 0.1 ms a prefill token, 1 µs a token of decode context, 0.2 ms a decode.
MODEL = StepTimeModel(0.01, 1e-4, 0.0, 0.01, 1e-6, 2e-4)


def test_step_time_is_what_time2bs_inverts():
    # 8 decodes over 4,000 tokens of context: 10 + 4 + 1.6 ms, then 0.1 ms a prefill token.
    assert step_time(MODEL, 4000, 8, 300) == pytest.approx(0.0156 + 0.03)
    assert time2bs(MODEL, step_time(MODEL, 4000, 8, 300) + 1e-9, 4000, 8) == 300
    assert time2bs(MODEL, 0.05, 4000, 8) == 344  # (50 − 15.6) / 0.1


def test_the_pace_follows_steps_slower_than_the_profile_and_never_goes_below_it():
    pace = StepPace()
    assert pace.scale == 1.0
    pace.observe(0.02, 0.04)  # twice the prediction
    assert pace.scale == pytest.approx(1 + PACE_WEIGHT)
    for _ in range(200):
        pace.observe(0.02, 0.04)
    assert pace.scale == pytest.approx(2.0, abs=1e-4)
    for _ in range(200):  # faster than the profile: the profile's own error, not a pace
        pace.observe(0.02, 0.01)
    assert pace.scale == pytest.approx(1.0, abs=1e-4)
    pace = StepPace(weight=1.0)
    pace.observe(0.01, 1.0)  # a stall counts as 4x at most
    assert pace.scale == 4.0
    pace.observe(0.0, 1.0)  # nothing predicted: nothing learnt
    pace.observe(0.01, -1.0)
    assert pace.scale == 4.0
    with pytest.raises(ValueError, match="weight"):
        StepPace(weight=0.0)


def test_a_slower_pace_leaves_smaller_chunks():
    """Scaled by the pace, a 50 ms TPOT's budget beside 8 decodes shrinks from 344 tokens to
    (50 − 2 × 15.6) / (2 × 0.1) = 94."""
    pace = StepPace(weight=1.0)
    pace.observe(0.02, 0.04)
    scaled = MODEL.scaled(pace.scale, pace.scale)
    assert time2bs(scaled, 0.05, 4000, 8) == 94
