"""The work bound (hfx/evaluation/bound.py): each term as Eq. 1 and Eq. 2 charge it, the
costliest requests left unserved, prefixes cached where they were computed before; and no
policy's run in the simulator attains the target above it."""

from __future__ import annotations

import pytest

from hfx.config import SimConfig
from hfx.evaluation.bound import cached_prefixes, config_bound, work_bound
from hfx.request import Request
from hfx.sim.driver import simulate
from hfx.stepmodel.step_time import StepTimeModel


def model(**terms: float) -> StepTimeModel:
    base = dict.fromkeys(("prefill_a", "prefill_b", "prefill_c", "decode_a", "decode_b",
                          "decode_c"), 0.0)
    return StepTimeModel(**{**base, **terms})


def reqs(*shapes: tuple[int, int]) -> list[Request]:
    return [Request(f"r{i}", float(i), p, o) for i, (p, o) in enumerate(shapes)]


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
