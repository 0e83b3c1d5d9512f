"""What the prefix cache costs the simulator: the same runs with ``--prefix-caching`` on and off,
interleaved, each in a fresh process, medians of CPU and wall time. Writes JSON; not a test.

Cases (issue 46's targets: on at most 1.3x off):
- four-task (no request names its content: nothing to match) on 8 instances;
- a Mooncake-format session trace (``bench/sim/make_session_trace.py``: 512-token hash ids, 81%
  of prompt blocks repeat) on 32 instances at ``--trace-qps``;
- ``chat-sessions`` (16-token hashes: 32x the units of the trace a request) on 8 instances.

    python bench/sim/make_session_trace.py --out /tmp/sessions.jsonl
    python bench/sim/prefix_cost.py --trace /tmp/sessions.jsonl --repeat 3 --json out.json
    python bench/sim/prefix_cost.py --trace /tmp/sessions.jsonl --native ...   # compiled

With caching off the results are those of the code before the cache (the golden tests hold
that); on, the hit rate and attainment of each run are in the output beside its times. The cache
changes the work itself (prefills skipped, other batches, more steps; HFX's dispatch waits for
hits): each case also gives the ratio per engine step, and ``--policy rr`` a dispatcher that
decides the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from hfx.evaluation import code_commit, write_json

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys, time
from hfx.config import SimConfig
from hfx.sim.driver import simulate
config = SimConfig(**json.loads(sys.argv[1]))
t0, c0 = time.perf_counter(), time.process_time()
r = simulate(config)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
from hfx import native
print(json.dumps({"wall_seconds": wall, "cpu_seconds": cpu, "attainment": r["attainment"],
                  "hit_rate": r["hit_rate"], "requests": r["requests"],
                  "engine_steps": r["engine_steps"], "compiled": native.active()}))
"""


def cases(trace: str, trace_qps: float, policy: str = "hfx") -> list[dict]:
    return [
        {"name": "four-task, 8 instances", "workload": "four-task", "policy": policy,
         "instances": 8, "qps": 360.0, "requests_per_task": 3000},
        {"name": "session trace, 32 instances", "workload": trace, "policy": policy,
         "instances": 32, "trace_qps": trace_qps, "slo_map": "default=2000:500"},
        {"name": "chat-sessions, 8 instances", "workload": "chat-sessions", "policy": policy,
         "instances": 8, "qps": 40.0, "duration": 600.0, "warmup": 120.0},
    ]


def one(case: dict, caching: bool, compiled: bool) -> dict:
    cfg = {k: v for k, v in case.items() if k != "name"} | {"prefix_caching": caching}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True,
                          text=True, check=True, cwd=ROOT,
                          env={**os.environ, "HFX_NATIVE": "1" if compiled else "0"})
    r = json.loads(done.stdout.strip().splitlines()[-1])
    if r.pop("compiled") != compiled:
        raise SystemExit(f"ran {'as Python' if compiled else 'compiled'}: build first "
                         "(hfx native build)")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="a Mooncake-format session trace")
    ap.add_argument("--trace-qps", type=float, default=64.0,
                    help="the trace's rate on 32 instances (default 64)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--native", action="store_true", help="run compiled (hfx native build)")
    ap.add_argument("--case", action="append", default=None,
                    help="only the cases whose name starts with this (repeatable)")
    ap.add_argument("--policy", default="hfx",
                    help="the dispatcher (hfx sees the caches and so decides otherwise with "
                         "them; round robin decides alike: the engines' and index's cost alone)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict = {"command": "python bench/sim/prefix_cost.py " + " ".join(sys.argv[1:]),
                 "commit": code_commit(),
                 "python": platform.python_version(), "compiled": args.native, "cases": []}
    for case in cases(args.trace, args.trace_qps, args.policy):
        if args.case and not any(case["name"].startswith(c) for c in args.case):
            continue
        cpu: dict[bool, list[float]] = {True: [], False: []}
        wall: dict[bool, list[float]] = {True: [], False: []}
        results: dict[bool, dict] = {}
        for _ in range(args.repeat):
            for caching in (False, True):
                r = one(case, caching, args.native)
                cpu[caching].append(r.pop("cpu_seconds"))
                wall[caching].append(r.pop("wall_seconds"))
                results[caching] = r
        row = {**case, "cpu_off": cpu[False], "cpu_on": cpu[True],
               "wall_off": wall[False], "wall_on": wall[True],
               "median_cpu_off": statistics.median(cpu[False]),
               "median_cpu_on": statistics.median(cpu[True]),
               "results_off": results[False], "results_on": results[True]}
        row["cpu_ratio"] = row["median_cpu_on"] / row["median_cpu_off"]
        # The cache changes what the engines do (shorter prefills, other batches, another
        # dispatch): the cost per engine step is the simulator's own overhead.
        row["cpu_per_step_ratio"] = row["cpu_ratio"] * (results[False]["engine_steps"]
                                                        / results[True]["engine_steps"])
        out["cases"].append(row)
        print(f"{case['name']:30s} off {row['median_cpu_off']:.2f} s, on "
              f"{row['median_cpu_on']:.2f} s CPU: {row['cpu_ratio']:.2f}x, "
              f"{row['cpu_per_step_ratio']:.2f}x per engine step "
              f"(hit rate {results[True]['hit_rate']:.3f}; attainment "
              f"{results[False]['attainment']:.3f} -> {results[True]['attainment']:.3f})",
              flush=True)
        if args.json:
            write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
