"""Fitting the step-time model (HyperFlexis Appendix A: Eq. 1 and Eq. 2 by least squares on the
relative error) to measured steps, from any source: the own engine's grid
(hfx/engine/profiler.py) or a vLLM server's (hfx/backends/vllm/profiler.py). Every fourth
sample is held out of the fit and reported separately (``fit_mape``: ``prefill``/``decode`` on
the fitted points, ``*_heldout`` on the rest), so the error says how well the model predicts
steps it has not seen."""

from __future__ import annotations

import numpy as np

from hfx.stepmodel.latency import Profile, StepTimeModel, fit_decode, fit_prefill, prefill_terms

# A prefill step: the chunks it computes (whole prompts: their lengths), seconds, and the
# tokens each chunk found cached (a prefix-cache hit; 0 for whole prompts).
PrefillSample = tuple[list[int], float, int]
# (prefill samples; decode samples: batch, Σ context, seconds)
Samples = tuple[list[PrefillSample], list[tuple[int, int, float]]]

HELD_OUT_EVERY = 4


def _split(samples: list) -> tuple[list, list]:
    fit = [s for i, s in enumerate(samples) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    held = [s for i, s in enumerate(samples) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    return fit, held


def _mape(predict, samples: list, target) -> float:
    if not samples:
        return float("nan")
    return float(np.mean([abs(predict(s) - target(s)) / target(s) for s in samples]))


def fit_profile(name: str, prefill: list[PrefillSample],
                decode: list[tuple[int, int, float]], capacity_tokens: int, block_size: int,
                meta: dict) -> Profile:
    pre_fit, pre_held = _split(prefill)
    dec_fit, dec_held = _split(decode)
    (pa, pb, pc, pe), pre_mape = fit_prefill(pre_fit)
    (da, db, dc), dec_mape = fit_decode(dec_fit)
    model = StepTimeModel(pa, pb, pc, da, db, dc, pe)
    fit_mape = {
        "prefill": pre_mape,
        "decode": dec_mape,
        "prefill_heldout": _mape(lambda s: model.prefill_time(*prefill_terms(s)), pre_held,
                                 lambda s: s[1]),
        "decode_heldout": _mape(lambda s: model.decode_time(s[1], s[0]), dec_held,
                                lambda s: s[2]),
    }
    meta = dict(meta, samples={"prefill": [[len(ls), ls[0], t, *([k] if k else [])]
                                           for ls, t, k in prefill],
                               "decode": [[b, ctx, t] for b, ctx, t in decode]})
    return Profile(name=name, model=model, kv_capacity_tokens=capacity_tokens,
                   block_size=block_size, source="measured", fit_mape=fit_mape, meta=meta)


def samples_of(profile: Profile) -> Samples:
    """A measured profile's samples, in the forms ``measure`` returns."""
    got = profile.meta["samples"]
    return ([([row[1]] * row[0], row[2], row[3] if len(row) > 3 else 0)
             for row in got["prefill"]],
            [(b, ctx, t) for b, ctx, t in got["decode"]])


def refit(profile: Profile, also: Samples) -> Profile:
    """``profile`` fitted again on its own samples and ``also`` (no new measurement)."""
    own = samples_of(profile)
    meta = {k: v for k, v in profile.meta.items() if k != "samples"}
    return fit_profile(profile.name, own[0] + also[0], own[1] + also[1],
                       profile.kv_capacity_tokens, profile.block_size, meta)
