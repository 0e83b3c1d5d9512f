"""Step-time model: the HFX forms, relative-error fitting, profiles."""

from __future__ import annotations

import math
import pickle
import random
from dataclasses import astuple, replace

import numpy as np
import pytest

from hfx.engine.step_noise import StepNoise, lognormal
from hfx.stepmodel import roofline
from hfx.stepmodel.latency import (
    BatchShape,
    Profile,
    StepTimeModel,
    fit_decode,
    fit_prefill,
    load_profile,
)
from hfx.stepmodel.profiles import shipped_profiles

MODEL = StepTimeModel(0.010, 5e-5, 2e-9, 0.020, 4e-8, 1e-4)


def test_eq1_eq2_and_mixed_batch():
    s = BatchShape()
    s.add_prefill(100)
    s.add_prefill(50)
    assert MODEL.step_time(s) == pytest.approx(0.010 + 5e-5 * 150 + 2e-9 * (100**2 + 50**2))
    d = BatchShape()
    d.add_decode(300)
    d.add_decode(700)
    assert MODEL.step_time(d) == pytest.approx(0.020 + 4e-8 * 1000 + 1e-4 * 2)
    m = BatchShape()
    m.add_prefill(64, cached=128)
    m.add_decode(1000)
    # One fixed overhead (the larger), both variable parts; the chunk attends its prefix.
    assert MODEL.step_time(m) == pytest.approx(
        0.020 + 5e-5 * 64 + 2e-9 * 64 * (128 + 64) + 4e-8 * 1000 + 1e-4)
    assert MODEL.step_time(BatchShape()) == 0.0


def test_the_noise_draw_is_the_standard_librarys_bit_for_bit():
    """``lognormal`` (compiled under HFX_NATIVE) takes the same uniforms from the same stream
    and gives the same factor as ``random``'s own ``lognormvariate``: a seed's run is the same
    whichever draws it."""
    ours, theirs = random.Random("seed"), random.Random("seed")
    drawn = [lognormal(ours, -0.0112, 0.1492) for _ in range(20_000)]
    assert drawn == [theirs.lognormvariate(-0.0112, 0.1492) for _ in range(20_000)]
    assert ours.random() == theirs.random()  # as many uniforms taken
    noise, rng = StepNoise(0.15, 7), random.Random(repr(7))
    sigma = math.sqrt(math.log1p(0.15 * 0.15))
    assert [noise.factor() for _ in range(100)] == \
        [rng.lognormvariate(-sigma ** 2 / 2, sigma) for _ in range(100)]


def test_a_shape_and_a_model_pickle_back_equal():
    """They travel to Ray actors (in a profile, a planned step), one format compiled and not."""
    shape = BatchShape(prefill_tokens=7, prefill_sq=49.0, num_prefill=1, decode_ctx=900,
                       num_decode=3, prefill_ck=70.0)
    for value in (shape, MODEL, replace(MODEL, prefill_e=1e-9)):
        assert pickle.loads(pickle.dumps(value)) == value


def test_fit_recovers_known_coefficients_from_noisy_samples():
    rng = np.random.default_rng(7)
    pre, dec = [], []
    for b in (1, 2, 4):
        for n in (16, 64, 256, 1024, 4096, 8192):
            lens = [n] * b
            t = MODEL.prefill_time(sum(lens), sum(x * x for x in lens))
            pre.append((lens, t * (1 + rng.normal(0, 0.01))))
    # Decode: long contexts and big batches, so that each term moves the step time.
    for b in (1, 8, 32, 64, 128):
        for n in (128, 1024, 4096, 8192):
            t = MODEL.decode_time(b * n, b)
            dec.append((b, b * n, t * (1 + rng.normal(0, 0.01))))
    (a, b_, c, e), mape = fit_prefill(pre)
    assert (a, b_, c) == pytest.approx((0.010, 5e-5, 2e-9), rel=0.05) and e == 0.0
    assert mape < 0.02
    (a2, b2, c2), mape2 = fit_decode(dec)
    assert (a2, b2, c2) == pytest.approx((0.020, 4e-8, 1e-4), rel=0.1)
    assert mape2 < 0.02


def test_fit_minimises_relative_not_absolute_error():
    # Two regimes an order of magnitude apart: a relative fit keeps the small ones accurate.
    samples = [([n], 0.001 + 1e-6 * n) for n in (1, 2, 4, 8)]
    samples += [([n], 0.1 + 1e-6 * n) for n in (1000, 2000)]  # outliers in absolute terms
    (a, b, c, _), _ = fit_prefill(samples)
    pred = a + b * 1 + c
    assert abs(pred - 0.001) / 0.001 < 1.0


def test_fit_keeps_coefficients_non_negative():
    samples = [(b, b * 10, 0.05 - 0.0001 * b) for b in range(1, 40)]
    coef, _ = fit_decode(samples)
    assert all(c >= 0 for c in coef)


def test_profile_json_round_trip(tmp_path):
    prof = Profile("x@y", MODEL, kv_capacity_tokens=1000, fit_mape={"prefill": 0.1})
    path = tmp_path / "p.json"
    prof.save(path)
    assert load_profile(path) == prof


def test_malformed_profile_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"name": "x", "prefill": {"a": 1}}')
    with pytest.raises(ValueError, match="malformed profile"):
        load_profile(path)
    with pytest.raises(FileNotFoundError, match="shipped"):
        load_profile("no-such-model@nowhere")


def test_shipped_profiles_are_the_roofline_fits():
    # Measured profiles (hfx profile) ship beside the roofline ones: tiny@cpu for hfx serve.
    names = [n for n in shipped_profiles() if load_profile(n).source == "roofline"]
    assert len(names) == len(roofline.MODELS) * len(roofline.HARDWARE)
    assert load_profile("tiny@cpu").source == "measured"
    for name in names:
        model, hw = name.split("@")
        shipped, fitted = load_profile(name), roofline.build_profile(model, hw)
        # The fit is least squares: its last bits move with numpy's BLAS build.
        assert replace(shipped, model=fitted.model) == fitted, f"{name} is stale"
        assert astuple(shipped.model) == pytest.approx(astuple(fitted.model), rel=1e-9), (
            f"{name} is stale: run python -m hfx.stepmodel.roofline")


def test_roofline_facts():
    m = roofline.MODELS["qwen2.5-7b"]
    assert 7.4e9 < m.params < 7.8e9  # Qwen2.5-7B has 7.6B parameters
    assert m.kv_bytes_per_token == 28 * 2 * 4 * 128 * 2
    rl = roofline.Roofline(m, roofline.HARDWARE["ascend-910b"])
    # Decode at batch 1 is memory bound: at least weights / bandwidth.
    assert rl.decode(1, 100) > m.weight_bytes / 1.6e12
    # A long prefill is compute bound and grows with the length.
    assert rl.prefill([2000]) > rl.prefill([1000]) > rl.prefill([10])


def test_fit_charges_a_cached_prefix_as_attention_over_it():
    """Prefix-cache hits (issue 46): a chunk of c tokens over k cached is Σ c and Σ c·(k + c)
    in Eq. 1. Hit samples from a known model fit back to it; read as whole prompts of c tokens
    (the cached prefix ignored) they cannot."""
    samples = [([n] * b, MODEL.prefill_time(b * n, b * n * n), 0)
               for b in (1, 4) for n in (64, 512, 2048)]
    hits = [([n] * b, MODEL.prefill_time(b * n, b * n * (k + n)), k)
            for b in (1, 4) for n in (64, 512) for k in (4096, 16384)]
    (a, b_, c, e), mape = fit_prefill(samples + hits)
    assert (a, b_, c) == pytest.approx((0.010, 5e-5, 2e-9), rel=1e-6) and mape < 1e-9
    assert e == pytest.approx(0.0, abs=1e-15)  # this model charges the prefix as Eq. 1 does
    _, blind = fit_prefill(samples + [(ls, t) for ls, t, _ in hits])
    assert blind > 0.05


def test_a_cached_prefix_gets_a_coefficient_of_its_own():
    """On the own engine a new token's attention over a cached prefix costs about twice a
    pair within the chunk (issue 46): ``prefill_e`` charges the excess, c·k·e. Hits from a
    model with it fit back to it, where Eq. 1's three coefficients alone cannot."""
    model = replace(MODEL, prefill_e=2e-9)
    s = BatchShape()
    s.add_prefill(64, cached=1024)
    assert s.prefill_ck == 64 * 1024
    assert model.step_time(s) == pytest.approx(0.010 + 5e-5 * 64 + 2e-9 * 64 * (1024 + 64)
                                               + 2e-9 * 64 * 1024)
    samples = [([n] * b, model.prefill_time(b * n, b * n * n), 0)
               for b in (1, 4) for n in (64, 512, 2048)]
    hits = [([n] * b, model.prefill_time(b * n, b * n * (k + n), b * n * k), k)
            for b in (1, 4) for n in (64, 512) for k in (4096, 16384)]
    (a, b_, c, e), mape = fit_prefill(samples + hits)
    assert (a, b_, c, e) == pytest.approx((0.010, 5e-5, 2e-9, 2e-9), rel=1e-6) and mape < 1e-9
    three = [([n] * b, model.prefill_time(b * n, b * n * (k + n), b * n * k), 0)
             for b in (1, 4) for n in (64, 512) for k in (4096, 16384)]
    # Without the cached lengths, no fourth coefficient, and the fit is off.
    assert fit_prefill(samples + three)[0][3] == 0.0
    prof = Profile("x@y", model, kv_capacity_tokens=1000)
    assert Profile.from_json(prof.to_json()) == prof
    assert "e" not in Profile("x@y", MODEL, kv_capacity_tokens=1000).to_json()["prefill"]


def test_a_profile_keeps_its_hit_samples_for_a_refit():
    from hfx.stepmodel.fit import fit_profile, samples_of

    prefill = [([64, 64], 0.02, 0), ([32], 0.01, 1024), ([8], 0.005, 0), ([16], 0.006, 0)]
    decode = [(1, 100, 0.02), (2, 300, 0.03), (4, 500, 0.04), (8, 900, 0.06)]
    profile = fit_profile("p", prefill, decode, 4096, 16, {})
    assert profile.meta["samples"]["prefill"] == [[2, 64, 0.02], [1, 32, 0.01, 1024],
                                                  [1, 8, 0.005], [1, 16, 0.006]]
    assert samples_of(profile) == (prefill, decode)
