"""Calibrating a step-time model against a served run (issue 15).

A profile measured on an idle server predicts each step alone. Serving adds what a profile never
sees: on a shared host, API-server, gateway and client processes take cores from the engine, and
tokens take time to reach the control plane. A *calibration run* (the workload and rate to be
predicted, with other arrivals and lengths) is served once; two scales, one for Eq. 1's
coefficients (prefill) and one for Eq. 2's (decode), are fitted so that the simulator reproduces
that run's mean TPOT and mean TTFT. A run served afterwards is then predicted with the scaled
model: a held-out test of the calibration, not a fit to the run being predicted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hfx.latency import StepTimeModel

# Simulated (mean TTFT, mean TPOT) in seconds of the calibration run's requests under a model.
Simulate = Callable[[StepTimeModel], tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Calibration:
    prefill_scale: float
    decode_scale: float
    rounds: int  # simulations run
    error: tuple[float, float]  # relative error of simulated (TTFT, TPOT) at the fitted scales

    def apply(self, model: StepTimeModel) -> StepTimeModel:
        return model.scaled(self.prefill_scale, self.decode_scale)


def fit_scales(model: StepTimeModel, simulate: Simulate, real_ttft: float, real_tpot: float,
               max_rounds: int = 12, tolerance: float = 0.005) -> Calibration:
    """Fixed-point iteration on the two scales: each round multiplies the decode scale by
    real / simulated TPOT and the prefill scale by real / simulated TTFT. TPOT depends on decode
    steps almost alone and TTFT mostly on prefills (queueing behind decodes is why both move
    together), so the iteration converges in a few rounds; it stops when both means are within
    ``tolerance`` or after ``max_rounds`` simulations."""
    if real_ttft <= 0 or real_tpot <= 0:
        raise ValueError("real means must be positive")
    prefill = decode = 1.0
    best: Calibration | None = None
    for rounds in range(1, max_rounds + 1):
        ttft, tpot = simulate(model.scaled(prefill, decode))
        err = ((ttft - real_ttft) / real_ttft, (tpot - real_tpot) / real_tpot)
        if best is None or max(map(abs, err)) < max(map(abs, best.error)):
            best = Calibration(prefill, decode, rounds, err)
        if max(map(abs, err)) <= tolerance:
            break
        decode *= real_tpot / tpot
        prefill *= real_ttft / ttft
    assert best is not None
    # A mean TTFT is a step function of the scales (a batch boundary moves), so the iteration
    # may circle within a point or two of the target: the closest round is the fit.
    return Calibration(best.prefill_scale, best.decode_scale, rounds, best.error)
