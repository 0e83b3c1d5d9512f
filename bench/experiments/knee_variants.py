"""HFX's dispatcher variants side by side at each workload's knee (issue 48): attainment under
Eq. 4 and per-token deadlines, one run per (cell, seed, variant), 2 instances of 1,024
sequences (8 for shared-prompts), at the loads where HFX crosses 90% (docs/results.md, "On
vLLM's engine" and the comparison tables).

    python bench/experiments/knee_variants.py --variants prefill_wait=batch prefill_wait=admitted \\
        --json docs/data/vllm_engine/knee_prefill_wait.json
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from hfx.config import SimConfig, parse_params
from hfx.evaluation import code_commit, write_json
from hfx.sim.driver import simulate

# (engine planner, workload, instances, requests/s, duration s, warm-up s)
CELLS = (("vllm", "four-task", 2, 165.0, 120.0, 20.0), ("vllm", "two-task", 2, 157.0, 120.0, 20.0),
         ("vllm", "bursty-four-task", 2, 151.0, 120.0, 20.0),
         ("vllm", "wikisql", 2, 35.0, 120.0, 20.0),
         ("deadline-chunked", "four-task", 2, 176.0, 120.0, 20.0),
         ("deadline-chunked", "two-task", 2, 154.0, 120.0, 20.0),
         ("deadline-chunked", "bursty-four-task", 2, 164.0, 120.0, 20.0),
         ("deadline-chunked", "wikisql", 2, 35.0, 120.0, 20.0),
         ("deadline-chunked", "tiered-512-512", 2, 45.0, 120.0, 20.0),
         ("deadline-chunked", "tiered-4096-1024", 2, 5.0, 120.0, 20.0),
         ("deadline-chunked", "shared-prompts", 8, 15.6, 300.0, 100.0),
         ("deadline-chunked", "agent-loops", 8, 8.0, 300.0, 100.0))


def one(job: tuple) -> dict:
    (planner, workload, instances, qps, duration, warmup), seed, variant = job
    fleet = {"model": "llama-3.1-8b", "hardware": "h200"} if workload.startswith("tiered") else {}
    r = simulate(SimConfig(policy="hfx", planner=planner, instances=instances, workload=workload,
                           qps=qps, seed=seed, duration=duration, warmup=warmup,
                           max_num_seqs=1024, policy_params=parse_params(variant), **fleet))
    return {"planner": planner, "workload": workload, "instances": instances, "qps": qps,
            "seed": seed, "variant": variant, "attainment": r["attainment"],
            "attainment_dslo": r["attainment_dslo"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", required=True, help="policy parameters, key=value,...")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--workloads", default=None,
                    help="only the cells of these workloads (comma-separated); default: all")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cells = [c for c in CELLS if args.workloads is None or c[1] in args.workloads.split(",")]
    jobs = [(cell, seed, v) for cell in cells for seed in range(args.seeds) for v in args.variants]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(one, jobs))
    table = []
    for planner, workload, instances, qps, *_ in cells:
        for v in args.variants:
            mine = [r for r in runs if (r["planner"], r["workload"], r["variant"])
                    == (planner, workload, v)]
            row = {"planner": planner, "workload": workload, "instances": instances, "qps": qps,
                   "variant": v, **{k: statistics.fmean(r[k] for r in mine)
                                    for k in ("attainment", "attainment_dslo")}}
            table.append(row)
            print(f"| {planner} | {workload} | {instances} | {qps:g} | {v} | "
                  f"{row['attainment']:.4f} | {row['attainment_dslo']:.4f} |", flush=True)
    if args.json:
        write_json(args.json, {"command": " ".join(["python", *sys.argv]), "commit": code_commit(),
                               "date": datetime.date.today().isoformat(), "runs": runs,
                               "table": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
