"""A request's SLO as HFX sends it to a vLLM server: its extra arguments (``vllm_xargs`` in the
OpenAI request, ``SamplingParams.extra_args`` in the engine), read by HFX's scheduler inside
the server (scheduler.py). The standard library only: vLLM's interpreter imports it."""

from __future__ import annotations

import math
from typing import Any

# Milliseconds: the TTFT left when the request was sent (the server counts it from its own
# arrival time), and the TPOT.
TTFT_ARG, TPOT_ARG = "hfx_ttft_ms", "hfx_tpot_ms"


def slo_args(ttft_left: float, tpot: float) -> dict[str, float]:
    """The extra arguments for a request with ``ttft_left`` seconds to its first token's
    deadline (at least 1 ms: one past it is still the most urgent) and a ``tpot`` in seconds."""
    return {TTFT_ARG: max(1.0, ttft_left * 1e3), TPOT_ARG: tpot * 1e3}


def slo_of(extra_args: Any) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) in seconds from a request's extra arguments; None for each that is missing
    or not a positive finite number."""
    if not isinstance(extra_args, dict):
        return None, None
    return _seconds(extra_args.get(TTFT_ARG)), _seconds(extra_args.get(TPOT_ARG))


def _seconds(ms: Any) -> float | None:
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        return None
    if not math.isfinite(ms) or ms <= 0:
        return None
    return ms / 1e3
