"""Simulator speed (issues 3 and 18). Writes JSON; not a test.

(a) four-task, 2 instances, at a QPS near saturation: simulated seconds and requests per wall
    second (median of --repeat runs). Target: >= 200x real time.
(b) PolyServe-scale stress (PolyServe evaluates at this scale): 300,000 requests of the four-task
    mix on 32 instances, at the per-instance load of (a). Target: < 120 s wall on one core.
(c) --grid: the scale grid of issue 18, every policy x instances x requests at 45 QPS per
    instance, each run in its own process under --run-timeout; growth ratios per policy (wall
    time of 10x the requests). Target: 10x requests -> <= 11x wall.

    python bench/sim/sim_speed.py --json results/sim_speed.json            # (a) and (b)
    python bench/sim/sim_speed.py --quick --json results/sim_speed.json    # (a) only, and a 30k (b)
    python bench/sim/sim_speed.py --grid --instances 2,8,32,128 --requests 1200,12000,120000 \
        --json results/sim_scale.json                                   # (c)
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.policies import POLICIES
from hfx.sim.driver import simulate


def measure(config: SimConfig) -> dict:
    t0 = time.perf_counter()
    r = simulate(config)
    wall = time.perf_counter() - t0
    # The process's peak so far: in a grid's child process, this run's (Linux: KiB).
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "policy": config.policy, "qps": config.qps, "instances": config.instances,
        "timed_out": False,
        "requests": r["requests"], "finished": r["finished"], "attainment": r["attainment"],
        "engine_steps": r["engine_steps"], "sim_seconds": r["sim_seconds"], "wall_seconds": wall,
        "sim_per_wall": r["sim_seconds"] / wall, "requests_per_wall_s": r["requests"] / wall,
        "tokens": round(r["output_tokens_per_s"] * (r["sim_seconds"])),
        "peak_rss_mb": peak_mb,
    }


PER_INSTANCE_QPS = 45.0  # the per-instance load of (a) and (b), past rr's knee


def grid(policies: list[str], instances: list[int], requests: list[int], timeout: float,
         path: str) -> dict:
    """(c): every point in a child process (a cut-off run is recorded, not waited for); the
    JSON is rewritten after each point so a long grid can be read while it runs."""
    out: dict = {"python": platform.python_version(), "machine": platform.machine(),
                 "per_instance_qps": PER_INSTANCE_QPS, "run_timeout_s": timeout, "runs": []}
    for total in requests:  # the small runs of every policy first
        for policy in policies:
            for n in instances:
                cfg = {"workload": "four-task", "policy": policy, "instances": n,
                       "qps": PER_INSTANCE_QPS * n, "requests_per_task": total // 4}
                try:
                    done = subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg)],
                                          capture_output=True, text=True, timeout=timeout,
                                          check=True)
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                except subprocess.TimeoutExpired:
                    row = {"policy": policy, "instances": n, "requests": total,
                           "timed_out": True, "wall_seconds": None}
                out["runs"].append(row)
                wall = row["wall_seconds"]
                print(f"{policy:13s} {n:5d} instances {total:7d} requests: "
                      + (f"{wall:8.2f} s wall, {row['sim_per_wall']:8.1f}x real time"
                         if wall is not None else f"cut off after {timeout:g} s"), flush=True)
                out["growth"] = growth(out["runs"])
                write_json(path, out)
    return out


def growth(runs: list[dict]) -> list[dict]:
    """Per policy and instance count: wall time at each request count over the one before."""
    rows = []
    key = {(r["policy"], r["instances"], r["requests"]): r for r in runs}
    for (policy, n, total), r in key.items():
        smaller = [k for k in key if k[0] == policy and k[1] == n and k[2] < total]
        if not smaller:
            continue
        prev = key[max(smaller, key=lambda k: k[2])]
        if r["wall_seconds"] and prev["wall_seconds"]:
            rows.append({"policy": policy, "instances": n, "from": prev["requests"],
                         "to": total, "requests_ratio": total / prev["requests"],
                         "wall_ratio": r["wall_seconds"] / prev["wall_seconds"]})
    return rows


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":  # a grid point, in a child process
        print(json.dumps(measure(SimConfig(**json.loads(sys.argv[2])))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=float, default=90.0,
                    help="(a) total QPS on 2 instances; 90 is the knee of rr (docs/results.md)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stress-requests", type=int, default=300_000)
    ap.add_argument("--stress-instances", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="a 30,000-request stress instead")
    ap.add_argument("--json", required=True, metavar="PATH")
    ap.add_argument("--grid", action="store_true", help="(c) only: the scale grid")
    ap.add_argument("--policies", default=",".join(POLICIES), help="(c): comma-separated")
    ap.add_argument("--instances", default="2,8,32,128,1000", help="(c): comma-separated")
    ap.add_argument("--requests", default="1200,12000,120000", help="(c): comma-separated")
    ap.add_argument("--run-timeout", type=float, default=1800.0, help="(c): seconds per run")
    args = ap.parse_args()
    if args.grid:
        grid(args.policies.split(","), [int(x) for x in args.instances.split(",")],
             [int(x) for x in args.requests.split(",")], args.run_timeout, args.json)
        return

    out: dict = {"python": platform.python_version(), "machine": platform.machine()}
    runs = [measure(SimConfig(workload="four-task", policy="rr", qps=args.qps, instances=2))
            for _ in range(args.repeat)]
    med = statistics.median(r["sim_per_wall"] for r in runs)
    out["near_saturation"] = {"runs": runs, "median_sim_per_wall": med,
                              "median_requests_per_wall_s":
                                  statistics.median(r["requests_per_wall_s"] for r in runs),
                              "target_sim_per_wall": 200}
    print(f"(a) four-task, 2 instances, {args.qps:g} QPS: {med:.0f}x real time, "
          f"{out['near_saturation']['median_requests_per_wall_s']:.0f} requests/s wall")

    n = 30_000 if args.quick else args.stress_requests
    per_task = n // 4
    qps = args.qps / 2 * args.stress_instances
    stress = measure(SimConfig(workload="four-task", policy="rr", qps=qps,
                               instances=args.stress_instances, requests_per_task=per_task))
    stress["target_wall_seconds"] = 120 if not args.quick else None
    out["stress"] = stress
    print(f"(b) {stress['requests']} requests on {args.stress_instances} instances at {qps:g} "
          f"QPS: {stress['wall_seconds']:.1f} s wall, {stress['sim_seconds']:.0f} s simulated, "
          f"attainment {stress['attainment']:.3f}")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
