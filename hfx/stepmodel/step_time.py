# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The step-time model's arithmetic (HyperFlexis §3, Eq. 1 and Eq. 2): a planned step's shape
and its predicted time. Every simulated step asks it once, so it is in the compiled set
(hfx/native.py); fitting and profiles are in latency.py, which describes the model's form.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, init=False)
class BatchShape:
    """What a step-time model needs to know about one planned step."""

    prefill_tokens: int  # Σ c_i: new prompt tokens computed this step
    prefill_sq: float  # Σ c_i·(k_i + c_i); equals Σ l_in² for whole prompts
    num_prefill: int
    prefill_ck: float  # Σ c_i·k_i: the new tokens' attention over their cached prefix
    decode_ctx: int  # Σ l_cur over decoding requests (prompt + generated so far)
    num_decode: int

    # Written out, not generated: mypyc compiles it (as hfx.request.Request's).
    def __init__(self, prefill_tokens: int = 0, prefill_sq: float = 0.0, num_prefill: int = 0,
                 decode_ctx: int = 0, num_decode: int = 0, prefill_ck: float = 0.0) -> None:
        self.prefill_tokens, self.prefill_sq, self.num_prefill = \
            prefill_tokens, prefill_sq, num_prefill
        self.decode_ctx, self.num_decode = decode_ctx, num_decode
        self.prefill_ck = prefill_ck

    def __reduce__(self) -> tuple[type[BatchShape], tuple[int, float, int, int, int, float]]:
        # Through the constructor, one format compiled and as Python (hfx/native.py).
        return BatchShape, (self.prefill_tokens, self.prefill_sq, self.num_prefill,
                            self.decode_ctx, self.num_decode, self.prefill_ck)

    def add_prefill(self, chunk: int, cached: int = 0) -> None:
        self.prefill_tokens += chunk
        self.prefill_sq += chunk * (cached + chunk)
        self.prefill_ck += chunk * cached
        self.num_prefill += 1

    def add_decode(self, context: int) -> None:
        self.decode_ctx += context
        self.num_decode += 1


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Coefficients of Eq. 1 (prefill: a, b, c) and Eq. 2 (decode: a', b', c') in seconds, and
    ``prefill_e`` (ours, issue 46): what a new token's attention over a cached prefix costs
    beyond ``prefill_c``. Eq. 1 charges a chunk of c tokens over k cached c·(k + c)·c_1, one
    coefficient for the chunk's attention over itself and over its prefix; on the own engine
    a pair over the prefix costs more than a pair within the chunk (its causal mask halves
    the second, not the first: c + e = 3.3·c fitted, docs/performance.md), so a fit over steps
    with hits gives it a term of its own: c·k·e. 0 (shipped and older profiles): Eq. 1 as the
    paper has it."""

    prefill_a: float
    prefill_b: float
    prefill_c: float
    decode_a: float
    decode_b: float
    decode_c: float
    prefill_e: float = 0.0

    def __reduce__(self) -> tuple[type[StepTimeModel], tuple[float, ...]]:
        # Through the constructor: compiled, a frozen class cannot be unpickled field by field.
        return StepTimeModel, (self.prefill_a, self.prefill_b, self.prefill_c, self.decode_a,
                               self.decode_b, self.decode_c, self.prefill_e)

    def prefill_time(self, sum_len: float, sum_sq: float, sum_ck: float = 0.0) -> float:
        """Eq. 1 for a prefill-only batch (``sum_ck``: Σ c·k over chunks with cached
        prefixes, charged ``prefill_e`` each)."""
        return (self.prefill_a + self.prefill_b * sum_len + self.prefill_c * sum_sq
                + self.prefill_e * sum_ck)

    def prefill_one(self, prompt_len: int) -> float:
        """Eq. 1 for one whole prompt alone."""
        return self.prefill_time(prompt_len, prompt_len * prompt_len)

    def decode_time(self, sum_ctx: float, batch: int) -> float:
        """Eq. 2 for a decode-only batch; 0 for an empty batch."""
        if batch == 0:
            return 0.0
        return self.decode_a + self.decode_b * sum_ctx + self.decode_c * batch

    def step_time(self, shape: BatchShape) -> float:
        if shape.num_decode == 0:
            if shape.num_prefill == 0:
                return 0.0
            return self.prefill_time(shape.prefill_tokens, shape.prefill_sq, shape.prefill_ck)
        if shape.num_prefill == 0:
            return self.decode_time(shape.decode_ctx, shape.num_decode)
        return (
            max(self.prefill_a, self.decode_a)
            + self.prefill_b * shape.prefill_tokens
            + self.prefill_c * shape.prefill_sq
            + self.prefill_e * shape.prefill_ck
            + self.decode_b * shape.decode_ctx
            + self.decode_c * shape.num_decode
        )

    def scaled(self, factor: float, decode: float | None = None) -> StepTimeModel:
        """Every prediction multiplied by ``factor`` (to study misprediction); with ``decode``,
        Eq. 1 by ``factor`` and Eq. 2 by ``decode`` (a calibration's two scales)."""
        d = factor if decode is None else decode
        return StepTimeModel(factor * self.prefill_a, factor * self.prefill_b,
                             factor * self.prefill_c, d * self.decode_a, d * self.decode_b,
                             d * self.decode_c, factor * self.prefill_e)
