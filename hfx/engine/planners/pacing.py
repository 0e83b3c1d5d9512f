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


def time2bs(model: Coefficients, t0: float, decode_ctx: float, num_decode: int) -> int:
    """Prefill tokens that fit a step of ``t0`` seconds beside these decodes (Eq. 1/2 mixed
    form, linear in the tokens; the quadratic term is negligible for one step's chunk)."""
    fixed = max(model.prefill_a, model.decode_a) if num_decode else model.prefill_a
    spare = t0 - fixed - model.decode_b * decode_ctx - model.decode_c * num_decode
    return max(0, int(spare / model.prefill_b))


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
