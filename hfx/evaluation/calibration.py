"""Calibrating a step-time model against a served run.

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

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from hfx.request import SLO, Request
from hfx.stepmodel.latency import StepTimeModel

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


# ---- calibrating on what a gateway served (hfx serve --calibrate-every) -----------------------
@dataclass(frozen=True, slots=True)
class Served:
    """One finished request as its instance served it: times on the serving loop's clock."""

    instance: int
    dispatched: float  # when the control plane sent it to the instance
    prompt_len: int
    output_len: int
    ttft: float  # first token − dispatched: what the instance (and the way back) took
    tpot: float
    slo: SLO  # deadline-aware planners order prefills by it


@dataclass(frozen=True, slots=True)
class ReplayEngine:
    """The engine a replay simulates: the served instances' planner and limits."""

    planner: str
    max_num_batched_tokens: int | None
    max_num_seqs: int
    kv_capacity_tokens: int
    block_size: int


def replay(model: StepTimeModel, served: Sequence[Served], engine: ReplayEngine,
           scored: Collection[int]) -> tuple[float, float]:
    """Mean TTFT (from dispatch) and TPOT that ``model`` gives the ``scored`` indices of
    ``served`` when each instance's requests are replayed on one simulated engine at the times
    they were dispatched: the policy's choices are the served ones, only the engine is
    simulated."""
    from hfx.config import SimConfig
    from hfx.sim.clock import run
    from hfx.sim.driver import run_cluster
    from hfx.stepmodel.latency import Profile

    config = SimConfig(policy="rr", instances=1, planner=engine.planner, step_noise=0.0,
                       max_num_batched_tokens=engine.max_num_batched_tokens,
                       max_num_seqs=engine.max_num_seqs,
                       kv_capacity_tokens=engine.kv_capacity_tokens,
                       block_size=engine.block_size,
                       token_delivery=0.0)  # the delivery is what the fit measures
    profile = Profile("replay", model, engine.kv_capacity_tokens, engine.block_size)
    by_instance: dict[int, list[int]] = {}
    for i, s in enumerate(served):
        by_instance.setdefault(s.instance, []).append(i)
    ttft = tpot = 0.0
    for indices in by_instance.values():
        t0 = min(served[i].dispatched for i in indices)
        requests = sorted((Request(str(i), served[i].dispatched - t0, served[i].prompt_len,
                                   served[i].output_len, served[i].slo) for i in indices),
                          key=lambda r: r.arrival)
        control, _ = run(run_cluster(config, requests, profile), virtual=True)
        for i in indices:
            if i in scored:
                record = control.records[str(i)]
                ttft += record.ttft or 0.0
                tpot += record.tpot or 0.0
    return ttft / len(scored), tpot / len(scored)


def fit_served(model: StepTimeModel, served: Sequence[Served], engine: ReplayEngine,
               warmup: float = 0.25) -> Calibration:
    """``fit_calibration`` on what was served: the replay of each instance's requests against
    their measured TTFT (from dispatch) and TPOT. The first ``warmup`` of the requests (by
    dispatch time) run in the replay but are not scored: requests served before the window
    shared their batches, and the replay starts empty."""
    order = sorted(range(len(served)), key=lambda i: served[i].dispatched)
    scored = frozenset(order[int(len(order) * warmup):])
    if not scored:
        raise ValueError("no served requests to calibrate on")
    real_ttft = sum(served[i].ttft for i in scored) / len(scored)
    real_tpot = sum(served[i].tpot for i in scored) / len(scored)
    return fit_calibration(model, lambda m: replay(m, served, engine, scored), real_ttft,
                           real_tpot)
