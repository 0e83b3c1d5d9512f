"""How far keeping TPOT tiers apart goes at PolyServe's fleet size: the capacity of the fleet
split by tier (``tier-split``, sized offline from the tiers' shares by ``split_fleet``) beside
least-loaded and HFX, all on one engine, under both metrics (docs/results.md, "How far keeping
TPOT tiers apart goes"). Writes JSON; not a test.

Each search is the comparison's (``dual_capacity``, its evaluation run and tolerance), warm
from a rate near the load balancers' capacity in docs/results.md's 20-instance table (a warm
start moves the first probe, not what the search resolves).

    python bench/experiments/tier_split.py --jobs 2 --json docs/data/tier_split.json
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from hfx.config import SimConfig
from hfx.evaluation import code_commit, write_json
from hfx.evaluation.compare import EVALUATION_RUN, METRICS, TARGET, dual_capacity, resolved
from hfx.policies.tier_split import split_fleet
from hfx.sim.driver import resolve_profile
from hfx.workloads.tasks import TIERS

WORKLOADS = ("tiered-512-512", "tiered-4096-1024")
FLEET = {"model": "llama-3.1-8b", "hardware": "h200", "max_num_seqs": 1024}  # PolyServe §5.1
# Where each search starts: about the load balancers' capacity at 20 instances (scaled by the
# fleet), each metric its own.
NEAR = {"tiered-512-512": 560.0, "tiered-4096-1024": 52.0}
CONTENDERS = ("least-loaded", "tier-split", "hfx")


def config(name: str, workload: str, instances: int, engine: str, seed: int) -> SimConfig:
    base = {**FLEET, "workload": workload, "instances": instances, "seed": seed,
            "planner": engine, "duration": EVALUATION_RUN["duration"],
            "warmup": EVALUATION_RUN["warmup"], "qps": NEAR[workload] * instances / 20}
    params: dict[str, float | str] = {}
    if name == "tier-split":
        params = {"tpots": "/".join(str(t) for t, _ in TIERS),
                  "groups": "/".join(str(g) for g in groups(instances))}
    return SimConfig(policy=name, policy_params=params, **base)


def groups(instances: int) -> list[int]:
    """PolyServe §5.1's tier shares over the fleet, by the time each pace leaves an instance
    (the profile's decode_a: the fixed cost of a step)."""
    fixed = resolve_profile(SimConfig(workload=WORKLOADS[0], **FLEET)).model.decode_a
    return split_fleet(instances, [s for _, s in TIERS], [t for t, _ in TIERS], fixed)


def search(job: tuple[str, str, int, str, int]) -> dict[str, Any]:
    name, workload, instances, engine, seed = job
    cfg = config(name, workload, instances, engine, seed)
    start = cfg.qps
    found = dual_capacity(cfg, TARGET, EVALUATION_RUN["tolerance"],
                          warm={m: start for m in METRICS})
    return {"contender": name, "workload": workload, "instances": instances, "engine": engine,
            "policy_params": dict(cfg.policy_params), **found}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--engine", default="vllm", help="every contender's engine planner")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(n, w, args.instances, args.engine, s) for w in args.workloads.split(",")
            for n in args.contenders.split(",") for s in seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(search, jobs))
    table = []
    print("| workload | contender | " + " | ".join(METRICS) + " | / least-loaded |")
    for w in args.workloads.split(","):
        base = None
        for n in args.contenders.split(","):
            mine = [r for r in rows if (r["workload"], r["contender"]) == (w, n)]
            caps = {m: [resolved(r, m) for r in mine] for m in METRICS}
            row: dict[str, Any] = {"workload": w, "contender": n}
            for m, values in caps.items():
                row[m] = statistics.fmean(values)
                row[f"{m}_std"] = statistics.pstdev(values)
            if n == "least-loaded":
                base = row
            if base is not None:
                row["over_least_loaded"] = {m: row[m] / base[m] for m in METRICS}
            table.append(row)
            ratio = " / ".join(f"{v:.2f}×" for v in row.get("over_least_loaded", {}).values())
            print(f"| {w} | {n} | " + " | ".join(
                f"{row[m]:.1f} ± {row[f'{m}_std']:.1f}" for m in METRICS) + f" | {ratio} |",
                flush=True)
    if args.json:
        write_json(args.json, {
            "command": " ".join(["python", *sys.argv]), "commit": code_commit(),
            "date": datetime.date.today().isoformat(), "groups": groups(args.instances),
            "protocol": {"evaluation_run": EVALUATION_RUN, "target": TARGET,
                         "engine": args.engine, "fleet": {**FLEET,
                                                          "instances": args.instances}},
            "searches": rows, "table": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
