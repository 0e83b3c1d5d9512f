"""The real vLLM bench's run order and paired statistics (bench/real_vllm/vllm_scheduler.py):
what its tables' comparisons rest on."""

from __future__ import annotations

import pytest

from bench.real_vllm.vllm_bench import vllm_config
from bench.real_vllm.vllm_scheduler import contenders, interleaved, paired


def test_repeats_alternate_the_policies_order():
    assert interleaved(["a", "b", "c"], 3) == [(0, "a"), (0, "b"), (0, "c"),
                                               (1, "c"), (1, "b"), (1, "a"),
                                               (2, "a"), (2, "b"), (2, "c")]


def test_paired_differences_match_runs_by_contender_seed_and_repeat():
    def run(policy: str, scheduler: str, seed: int, repeat: int, att: float) -> dict:
        return {"scheduler": scheduler, "qps": 12.0, "policy": policy, "seed": seed,
                "repeat": repeat, "attainment": att}

    runs = [run("hfx", "hfx", 0, 0, 0.90), run("ll", "stock", 0, 0, 0.95),
            run("hfx", "hfx", 0, 1, 0.80), run("ll", "stock", 0, 1, 0.90),
            run("hfx", "hfx", 1, 0, 0.70), run("ll", "stock", 1, 0, 0.70),
            run("hfx", "stock", 1, 1, 0.20),  # another contender: not hfx@hfx
            run("ll", "stock", 2, 0, 0.10)]  # no pair: left out
    out = paired(runs, 12.0, "ll@stock", "hfx@hfx")
    assert out["pairs"] == 3
    assert out["mean"] == pytest.approx(0.05)  # (0.05 + 0.10 + 0.00) / 3
    assert out["ci95"] == pytest.approx(1.96 * 0.05 / 3 ** 0.5, abs=1e-4)  # stdev 0.05
    assert paired(runs, 12.0, "ll@hfx", "hfx@hfx") == {}
    assert paired(runs, 8.0, "ll@stock", "hfx@hfx") == {}


def test_contenders_are_named_or_every_policy_on_every_scheduler():
    assert contenders("hfx@hfx,least-loaded@stock", "stock,hfx", "hfx") == [
        ("hfx", "hfx"), ("least-loaded", "stock")]
    assert contenders("hfx:theta=0.8@stock", "", "") == [("hfx:theta=0.8", "stock")]
    assert contenders(None, "stock,hfx", "hfx,ll") == [
        ("hfx", "stock"), ("ll", "stock"), ("hfx", "hfx"), ("ll", "hfx")]
    for bad in ("hfx", "hfx@sglang", "@stock"):
        with pytest.raises(ValueError, match="POLICY@SCHEDULER"):
            contenders(bad, "stock", "hfx")


def test_a_policy_variant_carries_its_parameters():
    config = vllm_config("hfx:prefill_wait=admitted,mature_order=maturity", 8.0, 1)
    assert config.policy == "hfx"
    assert config.policy_params == {"prefill_wait": "admitted", "mature_order": "maturity"}
    assert vllm_config("least-loaded", 8.0, 1).policy_params == {}
    assert vllm_config("hfx:theta=0.8", 8.0, 1).policy_params == {"theta": 0.8}  # a number
