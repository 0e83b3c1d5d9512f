"""Calibrating a step-time model against a served run (issue 15).

A profile measured on an idle server predicts each step alone. Serving adds what a profile never
sees. On a shared host, API-server, gateway and client processes take cores from the engine, so
decode steps run slower than profiled. And every token reaches the control plane some time after
the engine made it: the server's front end, the HTTP stream and the gateway's own loop. Against
vLLM on this project's 2-core VM (docs/performance.md), the simulated prefill matched vLLM's own
prefill time, while the TTFT that HFX saw was ~220 ms later and decode steps ~1.6x slower.

A *calibration run* (the workload and rate to be predicted, with other arrivals and lengths) is
served once, and two numbers are fitted so that the simulator reproduces its mean TPOT and mean
TTFT: a scale on Eq. 2's coefficients (decode) and a constant *delivery* latency added to every
token's time (so to TTFT and E2E, not TPOT). A run served afterwards is then predicted with them:
a held-out test of the calibration, not a fit to the run being predicted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from hfx.latency import StepTimeModel

# Simulated (mean TTFT, mean TPOT) in seconds of the calibration run's requests under a model.
Simulate = Callable[[StepTimeModel], tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Calibration:
    decode_scale: float  # on Eq. 2's coefficients
    delivery: float  # seconds from the engine's step to the control plane's record of a token
    rounds: int  # simulations run
    error: tuple[float, float]  # relative error of the fitted (TTFT, TPOT) means

    def apply(self, model: StepTimeModel) -> StepTimeModel:
        return model.scaled(1.0, self.decode_scale)


def fit_calibration(model: StepTimeModel, simulate: Simulate, real_ttft: float, real_tpot: float,
               max_rounds: int = 12, tolerance: float = 0.005) -> Calibration:
    """Fixed-point iteration: each round multiplies the decode scale by real / simulated TPOT
    and sets the delivery latency to real − simulated TTFT (never below 0: a simulator that is
    slower than the server is a model error, not a delivery). Stops when both means are within
    ``tolerance`` or after ``max_rounds`` simulations, keeping the closest round (a mean is a
    step function of the scale: a batch boundary moves)."""
    if real_ttft <= 0 or real_tpot <= 0:
        raise ValueError("real means must be positive")
    decode = 1.0
    best: Calibration | None = None
    for rounds in range(1, max_rounds + 1):
        ttft, tpot = simulate(model.scaled(1.0, decode))
        delivery = max(0.0, real_ttft - ttft)
        err = ((ttft + delivery - real_ttft) / real_ttft, (tpot - real_tpot) / real_tpot)
        if best is None or max(map(abs, err)) < max(map(abs, best.error)):
            best = Calibration(decode, delivery, rounds, err)
        if max(map(abs, err)) <= tolerance:
            break
        decode *= real_tpot / tpot
    assert best is not None
    return replace(best, rounds=rounds)
