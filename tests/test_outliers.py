"""Outlier ejection's decisions (hfx/cluster/outliers.py): when faults eject an instance, for
how long, and the bounds that keep the fleet serving."""

from __future__ import annotations

import pytest

from hfx.cluster.outliers import EjectionPolicy, OutlierDetector


def faults(detector: OutlierDetector, iid: int, n: int, now: float, pool: list[int],
           accepting: list[int]) -> float | None:
    until = None
    for _ in range(n):
        until = detector.fault(iid, now, pool, accepting) or until
    return until


def test_the_fifth_fault_in_a_row_ejects_and_a_whole_stream_resets_the_count():
    d = OutlierDetector(EjectionPolicy(consecutive=5, base_seconds=30))
    pool = list(range(10))
    assert faults(d, 3, 4, 0.0, pool, pool) is None
    d.success(3)  # a whole stream between: the count starts again
    assert faults(d, 3, 4, 1.0, pool, pool) is None
    assert d.fault(3, 2.0, pool, pool) == 32.0
    assert d.is_ejected(3) and d.ejected_now() == [3] and d.ejected[3] == 1


def test_each_ejection_is_longer_by_the_base_up_to_the_cap_and_quiet_time_shortens_it():
    d = OutlierDetector(EjectionPolicy(consecutive=1, base_seconds=10, max_seconds=25))
    pool = [0, 1]
    assert d.fault(0, 0.0, pool, pool) == 10.0
    assert d.readmit(0, 10.0)
    assert d.fault(0, 11.0, pool, pool) == 31.0  # second in a row: 2 x 10
    assert d.readmit(0, 31.0)
    assert d.fault(0, 32.0, pool, pool) == 57.0  # third: 30, capped at 25
    assert d.readmit(0, 57.0)
    # 25 s of quiet service: two base periods off the multiplier (3 -> 1), then this one.
    assert d.fault(0, 82.0, pool, pool) == 82.0 + 20.0


def test_the_share_bound_spares_the_rest_and_one_always_may_go():
    d = OutlierDetector(EjectionPolicy(consecutive=1, max_share=0.1))
    pool = list(range(4))  # 10% of 4 rounds to 0: one may still be ejected
    assert d.fault(0, 0.0, pool, pool) is not None
    assert d.fault(1, 0.0, pool, [1, 2, 3]) is None
    assert d.spared[1] == 1 and not d.is_ejected(1)
    big = list(range(20))  # 10% of 20: two at once
    d = OutlierDetector(EjectionPolicy(consecutive=1, max_share=0.1))
    assert d.fault(0, 0.0, big, big) is not None
    assert d.fault(1, 0.0, big, big[1:]) is not None
    assert d.fault(2, 0.0, big, big[2:]) is None


def test_never_the_last_instance_taking_work():
    d = OutlierDetector(EjectionPolicy(consecutive=1, max_share=1.0))
    assert d.fault(0, 0.0, [0], [0]) is None  # a pool of one
    assert d.fault(1, 0.0, [1, 2], [1]) is None  # the only one still accepting
    assert d.spared == {0: 1, 1: 1}


def test_zero_consecutive_never_ejects_and_bad_settings_are_refused():
    d = OutlierDetector(EjectionPolicy(consecutive=0))
    assert faults(d, 0, 50, 0.0, [0, 1], [0, 1]) is None
    with pytest.raises(ValueError, match="base_seconds"):
        EjectionPolicy(base_seconds=60, max_seconds=30)
    with pytest.raises(ValueError, match="max_share"):
        EjectionPolicy(max_share=1.5)


def test_a_failed_health_check_extends_the_ejection_and_forget_drops_the_instance():
    d = OutlierDetector(EjectionPolicy(consecutive=1, base_seconds=10))
    d.fault(0, 0.0, [0, 1], [0, 1])
    assert d.extend(0, 10.0) == 20.0 and d.is_ejected(0)
    d.forget(0)
    assert not d.is_ejected(0) and not d.readmit(0, 20.0)
