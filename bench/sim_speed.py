"""Simulator speed (issue 3 benchmark). Writes JSON; not a test.

(a) four-task, 2 instances, at a QPS near saturation: simulated seconds and requests per wall
    second (median of --repeat runs). Target: >= 200x real time.
(b) PolyServe-scale stress (seed 003 evaluates at this scale): 300,000 requests of the four-task
    mix on 32 instances, at the per-instance load of (a). Target: < 120 s wall on one core.

    python bench/sim_speed.py --json results/sim_speed.json            # both
    python bench/sim_speed.py --quick --json results/sim_speed.json    # (a) only, and a 30k (b)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.sim import simulate


def measure(config: SimConfig) -> dict:
    t0 = time.perf_counter()
    r = simulate(config)
    wall = time.perf_counter() - t0
    return {
        "policy": config.policy, "qps": config.qps, "instances": config.instances,
        "requests": r["requests"], "finished": r["finished"], "attainment": r["attainment"],
        "engine_steps": r["engine_steps"], "sim_seconds": r["sim_seconds"], "wall_seconds": wall,
        "sim_per_wall": r["sim_seconds"] / wall, "requests_per_wall_s": r["requests"] / wall,
        "tokens": round(r["output_tokens_per_s"] * (r["sim_seconds"])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=float, default=90.0,
                    help="(a) total QPS on 2 instances; 90 is the knee of rr (docs/results.md)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stress-requests", type=int, default=300_000)
    ap.add_argument("--stress-instances", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="a 30,000-request stress instead")
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()

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
