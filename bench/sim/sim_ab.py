"""Simulator speed of two checkouts, interleaved. Writes JSON; not a test.

This VM's speed moves by ±25% between minutes, so a speed change is measured by running the same
simulations on the code before and after it, alternating, each run in a fresh process, and
comparing medians. Each checkout is a directory holding ``hfx/`` (``git worktree add DIR REV``
makes one). The results (attainment, engine steps) must be identical: a speed change that moves
them is a behaviour change, and the script says so.

    git worktree add /tmp/before HEAD~1
    python bench/sim/sim_ab.py /tmp/before . --repeat 5 --json docs/data/sim_ab.json

Each tree runs as Python, whatever ``HFX_NATIVE`` says; with ``--native``, each runs compiled
(``hfx native``), from a build of its own source (made first where there is none).
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

from hfx.evaluation import write_json

# Four-task at 45 QPS per instance (rr's knee, as bench/sim/sim_speed.py), one case per engine
# planner family: prefill-first (rr), deadline-chunked (hfx), tpot-chunked (polyserve).
CASES = [
    {"policy": "rr", "instances": 2, "requests_per_task": 300},
    {"policy": "hfx", "instances": 2, "requests_per_task": 300},
    {"policy": "rr", "instances": 8, "requests_per_task": 3000},
    {"policy": "hfx", "instances": 8, "requests_per_task": 3000},
    {"policy": "polyserve", "instances": 8, "requests_per_task": 3000},
    {"policy": "hfx", "instances": 32, "requests_per_task": 7500},
]

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from hfx.config import SimConfig
from hfx.sim.driver import simulate
config = SimConfig(**json.loads(sys.argv[2]))
t0, c0 = time.perf_counter(), time.process_time()
r = simulate(config)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
from hfx import native
print(json.dumps({"wall_seconds": wall, "cpu_seconds": cpu, "attainment": r["attainment"],
                  "engine_steps": r["engine_steps"], "finished": r["finished"],
                  "compiled": native.active()}))
"""

BUILD = """
import sys
sys.path.insert(0, sys.argv[1])
from hfx import native
native.built() or native.build(log=False)
"""


def one(tree: str, case: dict, compiled: bool) -> dict:
    cfg = {"workload": "four-task", "qps": 45.0 * case.get("instances", 2), **case}
    # Each tree as it is: not the repository root's (the tree on sys.path is used), and
    # compiled only if asked, from its own build.
    done = subprocess.run([sys.executable, "-c", CHILD, str(Path(tree).resolve()),
                           json.dumps(cfg)], capture_output=True, text=True, check=True,
                          cwd="/", env={**os.environ, "HFX_NATIVE": "1" if compiled else "0"})
    r = json.loads(done.stdout.strip().splitlines()[-1])
    if r.pop("compiled") != compiled:
        raise SystemExit(f"{tree} ran {'as Python' if compiled else 'compiled'}")
    return r


def parse_case(text: str) -> dict:
    """``POLICY@INSTANCES:REQUESTS`` as a case of ``CASES``; ``POLICY@P+D:REQUESTS``, a P/D
    run on P prefill and D decode instances (45 QPS for each of them)."""
    try:
        policy, rest = text.split("@")
        instances, requests = rest.split(":")
        case = {"policy": policy, "requests_per_task": int(requests) // 4}
        if "+" in instances:
            prefill, decode = map(int, instances.split("+"))
            return {**case, "mode": "pd", "prefill": prefill, "decode": decode,
                    "instances": prefill + decode}
        return {**case, "instances": int(instances)}
    except ValueError:
        raise SystemExit(f"--case {text!r}: expected POLICY@INSTANCES:REQUESTS or "
                         "POLICY@P+D:REQUESTS, e.g. rr@128:48000, hfx@16+16:40000") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--case", action="append", default=None, metavar="POLICY@INSTANCES:REQUESTS",
                    help="run this case instead of the default set (repeatable), e.g. "
                         "rr@128:48000 (four-task at 45 QPS per instance, as the others); "
                         "hfx@16+16:40000 is P/D on 16 prefill and 16 decode instances")
    ap.add_argument("--sim", action="append", default=None, metavar="JSON",
                    help="run this case instead of the default set (repeatable): SimConfig's "
                         "fields as JSON, four-task at 45 QPS an instance where not given, e.g. "
                         "'{\"policy\": \"sa\", \"qps\": 150, \"planner\": \"vllm\", "
                         "\"max_num_seqs\": 256, \"duration\": 150, \"warmup\": 20}'")
    ap.add_argument("--native", action="store_true",
                    help="run both trees compiled (hfx native), building each where needed")
    args = ap.parse_args()
    if args.native:
        for tree in (args.before, args.after):
            subprocess.run([sys.executable, "-c", BUILD, str(Path(tree).resolve())], check=True,
                           cwd="/", env={**os.environ, "HFX_NATIVE": "0"})
    out: dict = {"command": "python bench/sim/sim_ab.py " + " ".join(sys.argv[1:]),
                 "python": platform.python_version(), "compiled": args.native, "cases": []}
    cases = [*(parse_case(c) for c in args.case or ()), *(json.loads(c) for c in args.sim or ())]
    for case in cases or CASES:
        walls: dict[str, list[float]] = {"before": [], "after": []}
        cpus: dict[str, list[float]] = {"before": [], "after": []}
        results: dict[str, dict] = {}
        for _ in range(args.repeat):
            for name in ("before", "after"):
                r = one(getattr(args, name), case, args.native)
                walls[name].append(r.pop("wall_seconds"))
                cpus[name].append(r.pop("cpu_seconds"))
                results[name] = r
        row = {**case, "wall_before": walls["before"], "wall_after": walls["after"],
               "median_before": statistics.median(walls["before"]),
               "median_after": statistics.median(walls["after"]),
               # The process's CPU time (time.process_time): what a busy host's steal and
               # other tenants move less than the wall time.
               "cpu_before": cpus["before"], "cpu_after": cpus["after"],
               "median_cpu_before": statistics.median(cpus["before"]),
               "median_cpu_after": statistics.median(cpus["after"]),
               "same_results": results["before"] == results["after"], "results": results}
        row["speedup"] = row["median_before"] / row["median_after"]
        row["cpu_speedup"] = row["median_cpu_before"] / row["median_cpu_after"]
        out["cases"].append(row)
        where = (f"P/D {case['prefill']}+{case['decode']}" if case.get("mode") == "pd"
                 else f"{case.get('instances', 2):3d} instances")
        what = (f"{4 * case['requests_per_task']:6d} requests" if "requests_per_task" in case
                else json.dumps({k: v for k, v in case.items() if k != "policy"}))
        print(f"{case['policy']:10s} {where} {what}: {row['median_before']:.2f} s -> "
              f"{row['median_after']:.2f} s ({row['speedup']:.2f}x); CPU "
              f"{row['median_cpu_before']:.2f} s -> {row['median_cpu_after']:.2f} s "
              f"({row['cpu_speedup']:.2f}x)"
              + ("" if row["same_results"] else "  RESULTS DIFFER"), flush=True)
        if args.json:
            write_json(args.json, out)
    return 0 if all(c["same_results"] for c in out["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
