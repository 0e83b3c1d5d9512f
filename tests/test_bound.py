"""The work bound (hfx/evaluation/bound.py): each term as Eq. 1 and Eq. 2 charge it, the
costliest requests left unserved, prefixes cached where they were computed before; and no
policy's run in the simulator attains the target above it."""

from __future__ import annotations

import numpy as np
import pytest

from hfx.config import SimConfig
from hfx.evaluation.bound import (
    cached_prefixes,
    config_bound,
    config_bounds,
    expected_outputs,
    work_bound,
)
from hfx.request import Request
from hfx.sim.driver import simulate
from hfx.stepmodel.step_time import StepTimeModel


def model(**terms: float) -> StepTimeModel:
    base = dict.fromkeys(("prefill_a", "prefill_b", "prefill_c", "decode_a", "decode_b",
                          "decode_c"), 0.0)
    return StepTimeModel(**{**base, **terms})


def reqs(*shapes: tuple[int, int], task: str = "chat") -> list[Request]:
    return [Request(f"r{i}", float(i), p, o, task=task) for i, (p, o) in enumerate(shapes)]


def test_each_term_is_charged_as_the_step_time_model_charges_it():
    two = reqs((100, 11), (300, 1))  # 10 decodes and none
    # Eq. 1's linear term: 400 prompt tokens for 2 requests, 1 ms each -> 0.2 s a request.
    assert work_bound(two, model(prefill_b=1e-3), 1, 8, 10**9, target=1.0).qps == \
        pytest.approx(2 / 0.4)
    # Its quadratic term over the least attention a prompt can be chunked into: p(p + 1)/2.
    b = work_bound(two, model(prefill_c=1e-6), 1, 8, 10**9, target=1.0)
    assert b.per_request["prefill"] == pytest.approx((100 * 101 / 2 + 300 * 301 / 2) * 1e-6 / 2)
    # Eq. 2 over the growing context: decodes see 101 ... 110 tokens.
    b = work_bound(two, model(decode_b=1e-6, decode_c=1e-3), 1, 8, 10**9, target=1.0)
    assert b.per_request["decode"] == pytest.approx((sum(range(101, 111)) * 1e-6 + 10e-3) / 2)
    # The fixed term: 10 decodes need at least 10 / 8 steps of a' each.
    b = work_bound(two, model(decode_a=0.02), 1, 8, 10**9, target=1.0)
    assert b.qps == pytest.approx(2 / (0.02 * 10 / 8))
    # ... or, where their context overflows the KV (1,055 tokens over 100), 10.55 steps.
    b = work_bound(two, model(decode_a=0.02), 1, 8, 100, target=1.0)
    assert b.alpha == 0.0 and b.qps == pytest.approx(2 / (0.02 * 1055 / 100))


def test_the_costliest_requests_go_unserved_and_instances_multiply():
    mix = reqs(*[(10, 1)] * 9, (1000, 1))
    m = model(prefill_b=1e-3)
    assert work_bound(mix, m, 1, 8, 10**9, target=1.0).qps == pytest.approx(10 / 1.09)
    assert work_bound(mix, m, 1, 8, 10**9, target=0.9).qps == pytest.approx(10 / 0.09)
    assert work_bound(mix, m, 3, 8, 10**9, target=0.9).qps == pytest.approx(30 / 0.09)
    with pytest.raises(ValueError, match="target"):
        work_bound(mix, m, 1, 8, 10**9, target=0.0)
    with pytest.raises(ValueError, match="at least one"):
        work_bound([], m, 1, 8, 10**9)


def test_the_blind_bound_pays_the_expected_output_of_what_it_serves():
    # Nine requests decode nothing and one decodes 100 tokens; all show the same prompt.
    mix = reqs(*[(10, 1)] * 9, (10, 101))
    m = model(prefill_b=1e-3, decode_c=1e-3)
    # Knowing the outputs, the costly one goes unserved: nine of 10 ms for ten requests.
    assert work_bound(mix, m, 1, 8, 10**9, target=0.9).qps == pytest.approx(10 / 0.09)
    # Blind, every one is expected to decode 10 tokens: nine of 20 ms are paid for.
    blind = work_bound(mix, m, 1, 8, 10**9, target=0.9, output_known=False)
    assert not blind.output_known and blind.qps == pytest.approx(10 / 0.18)
    # E[d²] is paid for the quadratic context term, not E[d]²: 100² / 10 over ten requests.
    ctx = work_bound(mix, model(decode_b=1e-6), 1, 8, 10**9, target=1.0, output_known=False)
    assert ctx.per_request["decode"] == pytest.approx(1e-6 * (10 * 10 + (1000 + 10) / 2))


def test_the_blind_bound_knows_a_task_and_its_prompt_length():
    # A task whose outputs follow its prompts (ten prompt lengths, 100 requests each), and
    # another whose outputs are 0 or 40 decodes whatever its prompt.
    follow = reqs(*[(p, 2 * p) for p in range(1, 11) for _ in range(100)], task="follow")
    other = [Request(f"o{i}", 50.0 + i, 5, 1 + 40 * (i % 2), task="other") for i in range(6)]
    both = follow + other
    lengths = (np.array([r.prompt_len for r in both], float),
               np.array([r.max_tokens - 1 for r in both], float))
    mean, square = expected_outputs([r.task for r in both], *lengths, bins=1)
    assert list(mean[:2]) == [10.0, 10.0] and list(mean[-6:]) == [20.0] * 6  # tasks apart
    assert square[-1] == pytest.approx(40 * 40 / 2)
    mean, _ = expected_outputs([r.task for r in both], *lengths, bins=10)
    assert list(mean[99:101]) == [1.0, 3.0]  # a bin by prompt length...
    assert list(mean[-6:]) == [20.0] * 6  # ...of at least OUTPUT_BIN_SIZE requests
    # A bin holds at least OUTPUT_BIN_SIZE requests: 199 of one task make one bin, 200 two.
    for n, bins in ((199, 1), (200, 2)):
        d = np.arange(n, dtype=float)
        mean, _ = expected_outputs(["t"] * n, d, d)
        assert len(set(mean)) == bins, n
    # Where the prompt tells the output, blind ranking costs nothing.
    m = model(prefill_b=1e-3, decode_b=1e-6, decode_c=1e-3, decode_a=0.01)
    known = work_bound(follow, m, 1, 8, 10**9, target=0.9)
    assert work_bound(follow, m, 1, 8, 10**9, target=0.9,
                      output_known=False).qps == pytest.approx(known.qps)


def test_no_blind_bound_where_outputs_may_follow_what_a_dispatcher_sees():
    # Sessions (and traces) may tie an output to its prompt more closely than a decile of its
    # length tells: no blind bound there, and asking for one is an error.
    config = SimConfig(workload="shared-prompts", qps=10.0, duration=30, max_num_seqs=64)
    work, blind = config_bounds(config)
    assert work.output_known and blind is None
    with pytest.raises(ValueError, match="no blind bound"):
        config_bound(config, output_known=False)
    _, blind = config_bounds(config.model_copy(update={"workload": "tiered-512-512"}))
    assert blind is not None and not blind.output_known


def test_a_prefix_counts_as_cached_only_after_an_earlier_request_computed_it():
    def r(rid: str, at: float, hashes: tuple[int, ...], prompt: int) -> Request:
        return Request(rid, at, prompt, 4, block_hashes=hashes, hash_block=16)

    first = r("a", 0.0, (1, 2, 3), 48)
    later = r("b", 1.0, (1, 2, 9), 40)  # shares two blocks; its third is partial
    other = r("c", 2.0, (7, 2, 3), 48)  # same blocks at other positions: a different prefix
    again = r("d", 3.0, (1, 2, 3, 4), 50)  # all of a's three blocks
    assert cached_prefixes([first, later, other, again], 16) == [0, 32, 0, 48]
    m = model(prefill_b=1e-3)
    on = work_bound([again, first], m, 1, 8, 10**9, target=1.0)  # ordered by arrival inside
    off = work_bound([first, again], m, 1, 8, 10**9, target=1.0, prefix_caching=False)
    assert on.cached_share == pytest.approx(48 / 98)
    assert on.qps == pytest.approx(2 / ((48 + 2) * 1e-3)) and off.qps == pytest.approx(
        2 / (98e-3))


@pytest.mark.parametrize(("workload", "under"), [
    # Sequence-bound (64 sequences an instance): HFX attains the target at 0.8 of the bound,
    # so the bound is not vacuous.
    ("four-task", 0.8),
    # Prompts that repeat: the bound counts every repeated prefix as cached.
    ("shared-prompts", None),
])
def test_no_steady_run_attains_the_target_above_the_bound(workload, under):
    config = SimConfig(policy="hfx", workload=workload, qps=10.0, duration=150, warmup=20,
                       max_num_seqs=64)
    bound = config_bound(config).qps
    assert simulate(config.model_copy(update={"qps": 1.05 * bound}))["attainment"] < 0.9
    if under is not None:
        assert simulate(config.model_copy(update={"qps": under * bound}))["attainment"] >= 0.9


def test_no_steady_run_attains_the_target_above_the_blind_bound():
    # Two-task's sharegpt outputs (208 ± 235 tokens) are drawn apart from its prompts: what
    # HFX cannot know costs the fleet 16% of the work bound, and HFX, which predicts outputs
    # from its tasks' history, misses the target 5% above the blind bound and attains it at
    # 0.8 of it (64 sequences an instance: sequence-bound).
    config = SimConfig(policy="hfx", workload="two-task", qps=10.0, duration=150, warmup=20,
                       max_num_seqs=64)
    work, blind = config_bounds(config)
    assert blind.qps < 0.9 * work.qps
    assert simulate(config.model_copy(update={"qps": 1.05 * blind.qps}))["attainment"] < 0.9
    assert simulate(config.model_copy(update={"qps": 0.8 * blind.qps}))["attainment"] >= 0.9
