"""Costs of this host that the real engine's numbers depend on, as JSON:

- thread hand-off: ``await loop.run_in_executor(pool, noop)``, what every TorchExecutor step
  pays to run the model off the event loop;
- first touch of fresh memory: filling a new 1 GB tensor, then filling it again, which is why
  warm-pool instances touch their parameter memory before a scale-out (weight_manager.warm_model).

    python bench/engine/host_overheads.py --json docs/results/host_overheads.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from hfx.evaluation import write_json


async def handoff(n: int) -> dict:
    loop = asyncio.get_running_loop()
    times = []
    with ThreadPoolExecutor(1) as pool:
        for _ in range(n):
            t = time.perf_counter()
            await loop.run_in_executor(pool, int)
            times.append(time.perf_counter() - t)
    times.sort()
    return {"runs": n, "mean_us": statistics.fmean(times) * 1e6,
            "p50_us": times[n // 2] * 1e6, "p99_us": times[int(n * 0.99)] * 1e6}


def first_touch(gb: float) -> dict:
    x = torch.empty(int(gb * 2**30), dtype=torch.uint8)
    t = time.perf_counter()
    x.fill_(1)
    fresh = time.perf_counter() - t
    t = time.perf_counter()
    x.fill_(2)
    touched = time.perf_counter() - t
    pages = x.numel() / 4096
    return {"gb": gb, "fresh_seconds": fresh, "touched_seconds": touched,
            "us_per_fresh_page": (fresh - touched) / pages * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {"handoff": asyncio.run(handoff(args.runs)), "first_touch": first_touch(args.gb)}
    h, f = out["handoff"], out["first_touch"]
    print(f"thread hand-off: mean {h['mean_us']:.0f} us, p50 {h['p50_us']:.0f}, "
          f"p99 {h['p99_us']:.0f}")
    print(f"first touch of {f['gb']:g} GB: {f['fresh_seconds']:.2f} s fresh, "
          f"{f['touched_seconds']:.2f} s touched ({f['us_per_fresh_page']:.1f} us per 4 KiB page)")
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
