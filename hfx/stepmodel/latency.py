"""Step-time model: predicts one engine step's duration from the batch composition.

The HFX form (HyperFlexis §3, Eq. 1 and Eq. 2; coefficients fitted as in Appendix A):

    prefill   E_p = a  + b·Σ l_in        + c·Σ l_in²                          (Eq. 1)
    decode    E_d = a' + b'·Σ l_cur      + c'·B                               (Eq. 2)

A *mixed* step (chunked prefill running beside decodes, as in Sarathi / vLLM v1) pays one fixed
overhead and the variable parts of both:

    E_mix = max(a, a') + b·Σ c_i + c·Σ c_i·(k_i + c_i) + b'·Σ l_cur + c'·B

where chunk i has c_i new tokens after k_i cached ones. For whole prompts (k_i = 0) the prefill
part is Eq. 1 exactly; the c_i·k_i term is the attention of a chunk over its cached prefix.

Coefficients come from least squares that minimises the squared *relative* error (Appendix A),
on samples from a real executor (`hfx profile`) or from the analytic roofline
(hfx/stepmodel/roofline.py).
Profiles are small JSON files shipped in hfx/stepmodel/profiles/.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from hfx.stepmodel.profiles import shipped_profiles


@dataclass(slots=True)
class BatchShape:
    """What a step-time model needs to know about one planned step."""

    prefill_tokens: int = 0  # Σ c_i: new prompt tokens computed this step
    prefill_sq: float = 0.0  # Σ c_i·(k_i + c_i); equals Σ l_in² for whole prompts
    num_prefill: int = 0
    decode_ctx: int = 0  # Σ l_cur over decoding requests (prompt + generated so far)
    num_decode: int = 0

    def add_prefill(self, chunk: int, cached: int = 0) -> None:
        self.prefill_tokens += chunk
        self.prefill_sq += chunk * (cached + chunk)
        self.num_prefill += 1

    def add_decode(self, context: int) -> None:
        self.decode_ctx += context
        self.num_decode += 1


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Coefficients of Eq. 1 (prefill: a, b, c) and Eq. 2 (decode: a', b', c') in seconds."""

    prefill_a: float
    prefill_b: float
    prefill_c: float
    decode_a: float
    decode_b: float
    decode_c: float

    def prefill_time(self, sum_len: float, sum_sq: float) -> float:
        """Eq. 1 for a prefill-only batch."""
        return self.prefill_a + self.prefill_b * sum_len + self.prefill_c * sum_sq

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
            return self.prefill_time(shape.prefill_tokens, shape.prefill_sq)
        if shape.num_prefill == 0:
            return self.decode_time(shape.decode_ctx, shape.num_decode)
        return (
            max(self.prefill_a, self.decode_a)
            + self.prefill_b * shape.prefill_tokens
            + self.prefill_c * shape.prefill_sq
            + self.decode_b * shape.decode_ctx
            + self.decode_c * shape.num_decode
        )

    def scaled(self, factor: float, decode: float | None = None) -> StepTimeModel:
        """Every prediction multiplied by ``factor`` (to study misprediction); with ``decode``,
        Eq. 1 by ``factor`` and Eq. 2 by ``decode`` (a calibration's two scales)."""
        d = factor if decode is None else decode
        return StepTimeModel(factor * self.prefill_a, factor * self.prefill_b,
                             factor * self.prefill_c, d * self.decode_a, d * self.decode_b,
                             d * self.decode_c)


def _fit_relative(features: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares on the relative error, Σ ((X·θ − y) / y)².

    Dividing each row by its target turns the relative error into an ordinary least-squares
    problem. Coefficients are kept non-negative by dropping a column that comes out negative and
    refitting (an active-set step): a negative latency coefficient is never physical.
    Returns (coefficients, mean absolute percentage error on the samples).
    """
    if len(times) < features.shape[1]:
        raise ValueError(f"need at least {features.shape[1]} samples to fit, got {len(times)}")
    if np.any(times <= 0):
        raise ValueError("step times must be positive")
    scaled = features / times[:, None]
    target = np.ones_like(times)
    active = list(range(features.shape[1]))
    coef = np.zeros(features.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(scaled[:, active], target, rcond=None)
        if np.all(sol >= 0):
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    mape = float(np.mean(np.abs(features @ coef - times) / times))
    return coef, mape


def fit_prefill(samples: Sequence[tuple[Sequence[int], float]]) -> tuple[tuple[float, ...], float]:
    """Fit Eq. 1 from (prompt lengths of the batch, measured seconds) samples."""
    rows = [(1.0, float(sum(ls)), float(sum(x * x for x in ls))) for ls, _ in samples]
    coef, mape = _fit_relative(np.array(rows), np.array([t for _, t in samples], dtype=float))
    return tuple(float(c) for c in coef), mape


def fit_decode(samples: Sequence[tuple[int, int, float]]) -> tuple[tuple[float, ...], float]:
    """Fit Eq. 2 from (batch size B, Σ l_cur, measured seconds) samples."""
    rows = [(1.0, float(ctx), float(b)) for b, ctx, _ in samples]
    coef, mape = _fit_relative(np.array(rows), np.array([t for *_, t in samples], dtype=float))
    return tuple(float(c) for c in coef), mape


@dataclass(frozen=True, slots=True)
class Profile:
    """A step-time model plus the instance facts the engine needs (KV capacity)."""

    name: str
    model: StepTimeModel
    kv_capacity_tokens: int
    block_size: int = 16
    source: str = "roofline"
    fit_mape: dict[str, float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "prefill": {"a": self.model.prefill_a, "b": self.model.prefill_b,
                        "c": self.model.prefill_c},
            "decode": {"a": self.model.decode_a, "b": self.model.decode_b,
                       "c": self.model.decode_c},
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "block_size": self.block_size,
            "fit_mape": self.fit_mape,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, data: dict) -> Profile:
        try:
            p, d = data["prefill"], data["decode"]
            model = StepTimeModel(float(p["a"]), float(p["b"]), float(p["c"]),
                                  float(d["a"]), float(d["b"]), float(d["c"]))
            return cls(
                name=str(data["name"]),
                model=model,
                kv_capacity_tokens=int(data["kv_capacity_tokens"]),
                block_size=int(data.get("block_size", 16)),
                source=str(data.get("source", "unknown")),
                fit_mape={k: float(v) for k, v in data.get("fit_mape", {}).items()},
                meta=dict(data.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed profile: {e!r}") from e

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile from a JSON path, or a shipped one by ``<model>@<hardware>`` name."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return Profile.from_json(json.loads(path.read_text()))
    name = str(name_or_path)
    if name in shipped_profiles():
        text = resources.files("hfx.stepmodel.profiles").joinpath(f"{name}.json").read_text()
        return Profile.from_json(json.loads(text))
    raise FileNotFoundError(
        f"no profile file or shipped profile {name!r}; shipped: {', '.join(shipped_profiles())}"
    )

