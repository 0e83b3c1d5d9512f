"""The dispatcher's step-time model, kept calibrated on what the gateway serves.

A profile is measured on idle servers before serving. Against vLLM on a shared host its decode
steps came out 1.2-2.5x too fast once serving loaded the machine (docs/performance.md), and the
dispatcher plans batches, maturity times and budgets with it. Every ``every`` seconds, once
enough requests have finished since the last fit, this task takes the latest ``window``
finished requests (colocated, not resumed), replays each instance's requests on a simulated
engine at the times they were dispatched (``hfx.evaluation.calibration.fit_served``: the
simulator's code path, the served placement), and fits the decode scale that reproduces their
mean TPOT. The dispatcher then predicts with the base profile's model scaled by it; the delivery
latency the fit also finds (the time from an engine's step to the gateway's record of the token) is
reported, not planned with: it does not occupy an engine.

The fit runs in a worker thread: a few simulations of a few hundred requests, tens to hundreds
of milliseconds of CPU per round, during which the gateway's loop shares the interpreter.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from hfx.cluster.control import ControlPlane
from hfx.evaluation.calibration import Calibration, ReplayEngine, Served, fit_served
from hfx.request import SLO, Outcome, RequestRecord
from hfx.sim.clock import cancel
from hfx.stepmodel.latency import StepTimeModel

log = logging.getLogger(__name__)

MIN_REQUESTS = 40  # fewer and one long request moves the means by more than the fit's gain
# A fitted scale outside this range is not a slower or faster engine but something the step
# model cannot hold (a stalled server, outputs of a few tokens whose gaps are all HTTP: 12.9
# once in the vLLM tier): it is logged and not applied.
SCALE_RANGE = (0.2, 5.0)
UNBOUNDED = SLO(1e9, 1e9)


def served(record: RequestRecord) -> Served | None:
    """What calibrating needs of a request that ended, or None if it cannot be replayed: not
    finished, fewer than two tokens (no TPOT), P/D (decoded on another instance) or resumed
    after a failure (served by two instances)."""
    if (record.outcome is not Outcome.FINISHED or record.num_tokens < 2
            or record.dispatch_time is None or record.instance is None
            or record.decode_instance is not None or record.retries):
        return None
    first, tpot = record.first_token_time, record.tpot
    assert first is not None and tpot is not None
    # A best-effort request kept its SLO as a target; the replay's rr dispatcher needs one.
    slo = record.slo or record.target or UNBOUNDED
    return Served(record.instance, record.dispatch_time, record.request.prompt_len,
                  record.num_tokens, first - record.dispatch_time, tpot, slo)


class LiveCalibrator:
    def __init__(self, control: ControlPlane, base: StepTimeModel, engine: ReplayEngine,
                 every: float, window: int = 400) -> None:
        if every <= 0:
            raise ValueError(f"calibration interval must be > 0 seconds, got {every}")
        self.control = control
        self.base = base  # every fit scales this, so fits never compound
        self.engine = engine
        self.every = every
        self.served: deque[Served] = deque(maxlen=window)
        self.new = 0  # observed since the last fit
        self.last: Calibration | None = None  # the fit in force
        self.rounds = 0  # fits run, applied or not
        self._task: asyncio.Task[None] | None = None

    def observe(self, record: RequestRecord) -> None:
        s = served(record)
        if s is not None:
            self.served.append(s)
            self.new += 1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._forever())

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.calibrate()
            except Exception:  # a failed fit must not end calibrating, nor serving
                log.exception("calibrating the step-time model failed; the last fit stays")

    async def calibrate(self) -> Calibration | None:
        """Fit on the window and apply the fit, if enough requests are new; returns it."""
        if self.new < MIN_REQUESTS // 2 or len(self.served) < MIN_REQUESTS:
            return None
        self.new = 0
        window = list(self.served)
        fit = await asyncio.to_thread(fit_served, self.base, window, self.engine)
        self.rounds += 1
        low, high = SCALE_RANGE
        if not low <= fit.decode_scale <= high:
            log.warning("calibration on %d requests gave decode x%.2f, outside [%g, %g]: not "
                        "applied", len(window), fit.decode_scale, low, high)
            return fit
        self.last = fit
        self.control.set_step_model(fit.apply(self.base))
        log.info("step-time model calibrated on %d served requests: decode x%.2f, delivery "
                 "%.0f ms (fit error TTFT %+.1f%%, TPOT %+.1f%%)", len(window), fit.decode_scale,
                 fit.delivery * 1e3, fit.error[0] * 100, fit.error[1] * 100)
        return fit
