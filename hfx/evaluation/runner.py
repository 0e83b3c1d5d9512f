"""Many independent runs: one after another, on a process pool, or on a Ray cluster.

Each run is a pure function of its arguments (a simulation is deterministic for its config), so
where it runs changes nothing: results come back in submission order whatever finishes first,
and a parallel sweep equals a serial one (tests/test_runner.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from tqdm import tqdm

R = TypeVar("R")


def run_all(fn: Callable[..., R], calls: Sequence[tuple[Any, ...]], jobs: int | None = None,
            ray_address: str | None = None, progress: bool = True,
            desc: str = "runs") -> list[R]:
    """``[fn(*args) for args in calls]``, computed in parallel.

    ``ray_address``: a Ray cluster to spread the runs over (``auto`` for the one this machine
    belongs to, ``ray://host:10001``, or ``local`` to start one here); hfx must be installed on
    its nodes. Otherwise ``jobs`` processes on this machine (default: one per core).
    """
    if not calls:
        return []
    bar = tqdm(total=len(calls), desc=desc, unit="run", disable=not progress or None)
    try:
        if ray_address:
            return _on_ray(fn, calls, ray_address, bar)
        jobs = max(1, min(jobs or os.cpu_count() or 1, len(calls)))
        if jobs == 1:
            out = []
            for args in calls:
                out.append(fn(*args))
                bar.update()
            return out
        results: list[Any] = [None] * len(calls)
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                bar.update()
        return results
    finally:
        bar.close()


def _on_ray(fn: Callable[..., R], calls: Sequence[tuple[Any, ...]], address: str,
            bar: tqdm) -> list[R]:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray-address needs Ray: pip install 'hfx[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 log_to_driver=False)
    try:
        remote = ray.remote(fn)
        refs = {remote.remote(*args): i for i, args in enumerate(calls)}
        results: list[Any] = [None] * len(calls)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results[refs[done[0]]] = ray.get(done[0])
            bar.update()
        return results
    finally:
        if started:
            ray.shutdown()
