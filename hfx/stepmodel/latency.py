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
from hfx.stepmodel.step_time import BatchShape, StepTimeModel

__all__ = ["BatchShape", "Profile", "StepTimeModel", "fit_decode", "fit_prefill", "load_profile",
           "prefill_terms"]


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


def fit_prefill(samples: Sequence[tuple[Sequence[int], float] | tuple[Sequence[int], float, int]]
                ) -> tuple[tuple[float, float, float, float], float]:
    """Fit Eq. 1 from (prompt lengths of the batch, measured seconds) samples, or (chunks of
    the batch, seconds, tokens cached before each chunk): a prefix-cache hit's step computes
    the chunk c over k cached tokens, Σ c, Σ c·(k + c) and Σ c·k (BatchShape.add_prefill).
    Returns (a, b, c, e): ``e`` (StepTimeModel.prefill_e) is fitted where at least two samples
    have hits and there are four samples in all, else 0."""
    hits = sum(1 for s in samples if cached(s)) >= 2 and len(samples) >= 4
    width = 4 if hits else 3  # the constant and prefill_terms' three, or its first two
    rows = [(1.0, *prefill_terms(s))[:width] for s in samples]
    coef, mape = _fit_relative(np.array(rows), np.array([s[1] for s in samples], dtype=float))
    a, b, c = (float(x) for x in coef[:3])
    return (a, b, c, float(coef[3]) if hits else 0.0), mape


def prefill_terms(sample: tuple[Sequence[int], float] | tuple[Sequence[int], float, int]
                  ) -> tuple[float, float, float]:
    """A prefill sample's (Σ c, Σ c·(k + c), Σ c·k): what ``StepTimeModel.prefill_time``
    takes, as ``BatchShape.add_prefill`` sums it."""
    k = cached(sample)
    return (float(sum(sample[0])), float(sum(x * (x + k) for x in sample[0])),
            float(sum(x * k for x in sample[0])))


def cached(sample: tuple[Sequence[int], float] | tuple[Sequence[int], float, int]) -> int:
    """The tokens cached before each chunk of a prefill sample (0: whole prompts)."""
    return sample[2] if len(sample) > 2 else 0  # type: ignore[misc]


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
                        "c": self.model.prefill_c,
                        **({"e": self.model.prefill_e} if self.model.prefill_e else {})},
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
                                  float(d["a"]), float(d["b"]), float(d["c"]),
                                  float(p.get("e", 0.0)))
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

