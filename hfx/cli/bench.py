"""``hfx bench``: a workload sent to a live server, the simulator's result JSON back."""

from __future__ import annotations

import argparse
from typing import Any

from hfx.cli.common import write_json


def add_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="drive a live server with a workload",
                           description="Send a workload (Poisson arrivals, Table 1 lengths and "
                           "SLOs) to a running hfx serve (or any OpenAI-compatible server that "
                           "accepts token-id prompts); write the result JSON of hfx sim.")
    bench.add_argument("--target", required=True, help="server URL, e.g. http://127.0.0.1:8000")
    bench.add_argument("--workload", default="four-task", help="task set or trace file")
    bench.add_argument("--qps", type=float, default=4.0, help="total requests/s")
    bench.add_argument("--requests-per-task", type=int, default=50)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", metavar="PATH", help="write the result object here")
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from hfx.evaluation.client import bench
    except ImportError as e:
        raise ValueError(f"hfx bench needs httpx ({e}): pip install -e '.[serve]'") from None
    result = bench(args.target, args.workload, args.qps, args.seed, args.requests_per_task)
    print(f"{result['model']} at {args.target}: {result['requests']} requests, "
          f"{result['finished']} finished, attainment {result['attainment']:.3f}, "
          f"{result['seconds']:.1f} s")
    for key in ("ttft", "tpot", "e2e"):
        m = result[key]
        if m["mean"] is not None:
            print(f"  {key.upper():4s} s  mean {m['mean']:.4f}  p50 {m['p50']:.4f}  "
                  f"p90 {m['p90']:.4f}  p99 {m['p99']:.4f}")
    if result["errors"]:
        print("  errors: " + "; ".join(result["errors"]))
    if args.json:
        write_json(args.json, result)
    return 0
