"""Dispatchers on vLLM's engine (issue 48): capacity at 90% attainment (HyperFlexis Eq. 4) of
each dispatcher on the same simulated engine, for two engines:

* ``vllm``: vLLM v1's scheduler as ``hfx serve --engine vllm`` starts it (priority policy, the
  priorities HFX sends; hfx/engine/planners/vllm.py): what an operator runs with
  ``--vllm-scheduler stock``;
* ``deadline-chunked``: HFX's planner, which HFX's scheduler inside vLLM runs
  (hfx/backends/vllm/scheduler.py): ``--vllm-scheduler hfx``, the default.

Each (workload, instances, engine, policy, seed) is one ``seed_capacity`` search over
steady-state runs (300 s after a 60 s warm-up), 1,024 sequences an instance; searches run in a
process pool. Reported: per cell, each policy's mean and HFX's ratio to the best other.

    python bench/experiments/vllm_engine.py --json docs/data/vllm_engine/capacity_2.json
    python bench/experiments/vllm_engine.py --workloads four-task --instances 2 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from hfx.config import SimConfig
from hfx.evaluation import code_commit, write_json
from hfx.evaluation.capacity import seed_capacity, steady

ENGINES = ("vllm", "deadline-chunked")
POLICIES = ("hfx", "least-loaded", "rr", "slos-serve")
# Where each search starts (requests/s per instance): near the knee, to save probes.
START_PER_INSTANCE = {"four-task": 60.0, "two-task": 60.0, "bursty-four-task": 40.0}


def one(workload: str, instances: int, engine: str, policy: str, seed: int,
        tolerance: float) -> tuple[tuple[str, int, str, str], dict]:
    start = START_PER_INSTANCE.get(workload, 20.0) * instances
    config = steady(SimConfig(workload=workload, instances=instances, policy=policy,
                              planner=engine, max_num_seqs=1024, qps=start, seed=seed))
    t0 = time.process_time()
    result = seed_capacity(config, 0.9, tolerance)
    result["cpu_seconds"] = time.process_time() - t0
    return (workload, instances, engine, policy), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="four-task,two-task,bursty-four-task")
    ap.add_argument("--instances", default="2")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tasks = [(w, int(n), e, p, s) for w in args.workloads.split(",")
             for n in args.instances.split(",") for e in args.engines.split(",")
             for p in args.policies.split(",")
             for s in range(args.first_seed, args.first_seed + args.seeds)]
    commit = code_commit()  # before the runs: the code they ran
    found: dict[tuple[str, int, str, str], list[dict]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one, *t, args.tolerance) for t in tasks]
        for f in as_completed(futures):
            key, result = f.result()
            found.setdefault(key, []).append(result)
            print(f"{key}: {result['capacity']:.1f} req/s "
                  f"({result['cpu_seconds']:.0f} s CPU)", flush=True)
    cells: dict[str, dict] = {}
    for (w, n, e, p), results in sorted(found.items()):
        cell = cells.setdefault(f"{w}/{n}/{e}", {"workload": w, "instances": n, "engine": e,
                                                 "policies": {}})
        caps = [r["capacity"] for r in results]
        cell["policies"][p] = {"mean": statistics.fmean(caps), "seeds": caps,
                               "std": statistics.pstdev(caps)}
    print(f"\n| workload | instances | engine | {' | '.join(args.policies.split(','))} "
          "| hfx / best other |")
    print("| --- " * (4 + len(args.policies.split(","))) + "|")
    for cell in cells.values():
        pol = cell["policies"]
        others = [v["mean"] for k, v in pol.items() if k != "hfx"]
        if "hfx" in pol and others and max(others) > 0:
            cell["hfx_over_best_other"] = pol["hfx"]["mean"] / max(others)
        row = " | ".join(f"{pol[p]['mean']:.1f}" if p in pol else ""
                         for p in args.policies.split(","))
        ratio = cell.get("hfx_over_best_other")
        print(f"| {cell['workload']} | {cell['instances']} | {cell['engine']} | {row} | "
              f"{'' if ratio is None else f'{ratio:.2f}x'} |")
    if args.json:
        write_json(args.json, {"command": "python bench/experiments/vllm_engine.py "
                               + " ".join(f"--{k.replace('_', '-')} {v}"
                                          for k, v in vars(args).items()
                                          if k != "json" and v is not None),
                               "commit": commit, "target": 0.9, "max_num_seqs": 1024,
                               "cells": cells})
    print(json.dumps({"cells": len(cells)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
