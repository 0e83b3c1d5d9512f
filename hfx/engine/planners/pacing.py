# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The arithmetic of TPOT-paced chunking (PolyServe §4.5, §4.7) and of HFX's deadline
override (deadline_chunked.py), apart from any engine: HFX's own planners and HFX's scheduler
inside vLLM (hfx/backends/vllm/scheduler.py) both decide with these, and the latter imports
this module in vLLM's environment, whose pins are not HFX's. So: the standard library only,
and the step-time model taken by its six coefficients' names (hfx.stepmodel.step_time)."""

from __future__ import annotations

import math
from typing import Protocol


class Coefficients(Protocol):
    """Eq. 1 and Eq. 2's coefficients (HyperFlexis §3): StepTimeModel's fields."""

    @property
    def prefill_a(self) -> float: ...
    @property
    def prefill_b(self) -> float: ...
    @property
    def prefill_c(self) -> float: ...
    @property
    def decode_a(self) -> float: ...
    @property
    def decode_b(self) -> float: ...
    @property
    def decode_c(self) -> float: ...


# How fast a measured pace follows the engine: each step moves it by this share of the step's
# measured / predicted ratio less the pace (the last ~20 steps count; ours).
PACE_WEIGHT = 0.05
# A step's ratio is clamped to this before it counts. Below 1 is the profile's own error: it
# is measured on an idle engine, the fastest the engine runs. Above 4 is a stall (a host that
# took the core away for a while), not the pace of the steps to come.
PACE_RANGE = (1.0, 4.0)


def _fixed(model: Coefficients, num_decode: int) -> float:
    return max(model.prefill_a, model.decode_a) if num_decode else model.prefill_a


def time2bs(model: Coefficients, t0: float, decode_ctx: float, num_decode: int) -> int:
    """Prefill tokens that fit a step of ``t0`` seconds beside these decodes (Eq. 1/2 mixed
    form, linear in the tokens; the quadratic term is negligible for one step's chunk)."""
    spare = t0 - _fixed(model, num_decode) - model.decode_b * decode_ctx \
        - model.decode_c * num_decode
    return max(0, int(spare / model.prefill_b))


def step_time(model: Coefficients, decode_ctx: float, num_decode: int,
              prefill_tokens: int) -> float:
    """A step's predicted time in the form ``time2bs`` inverts."""
    return _fixed(model, num_decode) + model.decode_b * decode_ctx \
        + model.decode_c * num_decode + model.prefill_b * prefill_tokens


class StepPace:
    """How much slower than its profile an engine's steps run while it serves: an exponentially
    weighted mean of each step's measured / predicted time, never below 1. A profile is
    measured on an idle server; serving beside an API server, a gateway and clients on shared
    cores slowed vLLM's steps 1.5-2x on this project's host (docs/results.md, "On real vLLM"),
    and steps paced to a TPOT by the profile then overran it."""

    def __init__(self, weight: float = PACE_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"pace weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.scale = 1.0

    def observe(self, predicted: float, measured: float) -> None:
        if not (predicted > 0 and measured > 0):
            return
        ratio = min(max(measured / predicted, PACE_RANGE[0]), PACE_RANGE[1])
        self.scale += self.weight * (ratio - self.scale)


def prefill_one(model: Coefficients, prompt_len: int) -> float:
    """Eq. 1 for one whole prompt alone."""
    return model.prefill_a + model.prefill_b * prompt_len + model.prefill_c * prompt_len ** 2


def runs_whole(model: Coefficients, remaining: int, budget: int, step: float | None,
               left: float | None, slack_share: float) -> bool:
    """Whether a prompt's ``remaining`` tokens run in this step rather than in chunks of
    ``budget`` tokens, each a step of about ``step`` seconds (None: the budget's prefill).

    Dynamic chunking (PolyServe §4.7): a rest under two budgets runs whole. HFX's override
    (ours, deadline_chunked.py): with ``left`` seconds to the prompt's TTFT deadline, a rest
    whose paced chunks would not be done within ``slack_share`` of that time runs whole if
    its prefill alone still keeps the deadline; one past saving keeps the paced chunks."""
    if remaining < 2 * budget or left is None:
        return remaining < 2 * budget
    if step is None:
        step = prefill_one(model, budget)
    paced = math.ceil(remaining / max(budget, 1)) * step
    return paced > slack_share * left and left >= prefill_one(model, remaining)
