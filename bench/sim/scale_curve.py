"""The cost of a request as the fleet grows, at the same load per instance (issue 31): rr,
four-task, 45 QPS per instance, ``--seconds`` of arrivals on each fleet size, each run in a
fresh process. Every run does the same work per instance (steps per request, tokens per step
are printed beside it), so a rise in the cost per request is the fleet's size alone: its working
set. Run it compiled with ``HFX_NATIVE=1``. Writes JSON; not a test.

    HFX_NATIVE=1 python bench/sim/scale_curve.py --instances 32,128,256,512,1000 --seconds 10 \
        --json docs/data/sim_scale_curve.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
from pathlib import Path

PER_INSTANCE_QPS = 45.0  # the cluster-scale targets' load (bench/sim/sim_budget.py)


def one(instances: int, seconds: float) -> dict:
    from hfx.config import SimConfig
    from hfx.native import active
    from hfx.sim.driver import simulate

    requests = int(PER_INSTANCE_QPS * instances * seconds)
    r = simulate(SimConfig(workload="four-task", policy="rr", instances=instances,
                           qps=PER_INSTANCE_QPS * instances, requests_per_task=requests // 4))
    wall, steps = r["wall_seconds"], r["engine_steps"]
    return {"instances": instances, "requests": r["requests"], "compiled": active(),
            "wall_seconds": wall, "sim_seconds": r["sim_seconds"],
            "us_per_request": wall / r["requests"] * 1e6, "steps_per_request":
            steps / r["requests"], "tokens_per_step": r["output_tokens_per_s"] *
            r["sim_seconds"] / steps, "attainment": r["attainment"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", default="32,128,256,512,1000")
    ap.add_argument("--seconds", type=float, default=10.0, help="simulated seconds of arrivals")
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()
    runs = []
    for n in map(int, args.instances.split(",")):
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", str(n),
                               str(args.seconds)], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = runs[-1]
        print(f"{n:5d} instances {r['requests']:8d} requests {r['wall_seconds']:7.2f} s "
              f"{r['us_per_request']:5.1f} us a request, {r['steps_per_request']:.2f} steps a "
              f"request, {r['tokens_per_step']:.0f} tokens a step, {r['peak_rss_mb']:.0f} MB",
              flush=True)
    Path(args.json).write_text(json.dumps({
        "command": " ".join(sys.argv), "python": platform.python_version(), "runs": runs},
        indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        print(json.dumps(one(int(sys.argv[2]), float(sys.argv[3]))))
    else:
        main()
