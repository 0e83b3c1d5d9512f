"""How much one engine step's time varies from run to run on the real engine.

The simulator's ``--step-noise`` is a coefficient of variation (std / mean) applied to every
step; this measures it. For each model shape and a spread of prefill and decode steps (the
profiler's grid points), the same step runs ``--repeats`` times through the real executor as
the serving path runs it (``hfx.engine.profiler.step_times``); the CV of those times is the step's
noise. Reported per point, and the median over points per shape.

    python bench/engine/step_noise.py --json docs/results/step_noise.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import numpy as np
import torch

from hfx.engine.block_manager import BlockManager
from hfx.engine.profiler import grid_step, step_times
from hfx.engine.torch_executor import TorchExecutor
from hfx.evaluation import write_json
from hfx.model.build import build_model

POINTS = (("p", 1, 128), ("p", 1, 512), ("p", 4, 256), ("p", 1, 1024),
          ("d", 1, 512), ("d", 8, 256), ("d", 32, 512), ("d", 64, 1024))
CAPACITY_TOKENS = 131072
BLOCK = 16


async def measure(shape: str, repeats: int) -> dict:
    loaded = build_model(shape, device="cpu")
    executor = TorchExecutor(loaded.model, CAPACITY_TOKENS // BLOCK, BLOCK, threaded=True)
    gen = np.random.default_rng(0)
    rows = []
    for kind, b, n in POINTS:
        out = grid_step(kind, b, n, BlockManager(CAPACITY_TOKENS // BLOCK, BLOCK), gen,
                        executor.vocab_size)
        times = await step_times(executor, out, repeats)
        mean = statistics.fmean(times)
        rows.append({"step": f"{'prefill' if kind == 'p' else 'decode'} {b}x{n}",
                     "mean_ms": mean * 1e3, "cv": statistics.stdev(times) / mean,
                     "p99_over_mean": float(np.percentile(times, 99)) / mean})
        print(f"{shape:14s} {rows[-1]['step']:18s} mean {mean * 1e3:8.2f} ms  "
              f"cv {rows[-1]['cv']:.3f}", flush=True)
    return {"shape": shape, "repeats": repeats, "points": rows,
            "median_cv": statistics.median(r["cv"] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="tiny,qwen2.5-0.5b:8",
                    help="shapes to measure, each SHAPE or SHAPE:REPEATS (a 0.5B model's CPU "
                    "steps take seconds)")
    ap.add_argument("--repeats", type=int, default=40, help="runs per step unless the shape "
                    "names its own")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shapes = []
    for item in args.shapes.split(","):
        shape, _, repeats = item.partition(":")
        shapes.append(asyncio.run(measure(shape, int(repeats or args.repeats))))
    report = {"command": "python bench/engine/step_noise.py", "device": "cpu",
              "threads": torch.get_num_threads(), "shapes": shapes,
              "median_cv": statistics.median(s["median_cv"] for s in shapes)}
    for s in shapes:
        print(f"{s['shape']}: median cv {s['median_cv']:.3f}")
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
