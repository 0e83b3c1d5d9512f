"""Parallel sweeps equal serial ones: the same results, in the same order, whether the runs go
one after another, to a process pool, or to a Ray cluster."""

from __future__ import annotations

import time

import pytest

from hfx.config import SimConfig
from hfx.evaluation.runner import run_all
from hfx.evaluation.sweep import run_grid

BASE = SimConfig(workload="four-task", requests_per_task=20)
# The first point is the slowest, so a pool finishes them out of order.
SERIES = [("hfx", {"policy": "hfx", "requests_per_task": 60}), ("rr", {"policy": "rr"})]
QPS = [40.0, 160.0]


def _comparable(results: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in results]


@pytest.fixture(scope="module")
def serial() -> list[dict]:
    return run_grid(BASE, SERIES, QPS, jobs=1, progress=False, seeds=2)


def test_grid_order_is_series_qps_seed(serial: list[dict]) -> None:
    assert [(r["series"], r["qps"], r["config"]["seed"]) for r in serial] == [
        (s, q, seed) for s, _ in SERIES for q in QPS for seed in (0, 1)]
    assert {r["requests"] for r in serial if r["series"] == "hfx"} == {240}


def test_process_pool_equals_serial(serial: list[dict]) -> None:
    pooled = run_grid(BASE, SERIES, QPS, jobs=2, progress=False, seeds=2)
    assert _comparable(pooled) == _comparable(serial)


def test_ray_equals_serial(serial: list[dict]) -> None:
    pytest.importorskip("ray")
    on_ray = run_grid(BASE, SERIES, QPS, progress=False, seeds=2, ray_address="local")
    assert _comparable(on_ray) == _comparable(serial)


def _late_square(x: int) -> int:
    time.sleep(0.1 * x)  # the first call finishes last
    return x * x


def test_run_all_keeps_submission_order() -> None:
    assert run_all(_late_square, [(3,), (1,), (2,)], jobs=2, progress=False) == [9, 1, 4]
    assert run_all(_late_square, [], jobs=2) == []
