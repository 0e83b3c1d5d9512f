"""HFX against the cache-aware routers on prompts that repeat: capacity at 90% attainment
under both SLO metrics (HyperFlexis Eq. 4 and per-token deadlines), with the hit rate at that
rate, each policy on its own engine and, for HFX, also on the routers' (vLLM's chunked
planner: the same engine terms). Writes JSON; not a test.

    python bench/sim/make_session_trace.py --out /tmp/sessions.jsonl
    python bench/sim/prefix_routers.py --trace /tmp/sessions.jsonl --instances 8 \\
        --json docs/data/prefix_cache/routers_8.json
    python bench/sim/prefix_routers.py --crossings docs/data/prefix_cache/routers_8.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from hfx.config import SimConfig
from hfx.evaluation import code_commit, write_json
from hfx.evaluation.capacity import crossing
from hfx.evaluation.compare import dual_capacity
from hfx.evaluation.runner import run_all

# name → config fields: each policy on its own engine; hfx also on vLLM's chunked one.
CONTENDERS: dict[str, dict[str, Any]] = {
    "hfx": {"policy": "hfx"},
    "hfx@chunked": {"policy": "hfx", "planner": "chunked"},
    "llm-d": {"policy": "llm-d"},
    "llm-d@precise": {"policy": "llm-d", "policy_params": {"index": "precise"}},
    "dynamo": {"policy": "dynamo"},
    "sglang": {"policy": "sglang"},
    "prefix-aware": {"policy": "prefix-aware"},
    "least-loaded": {"policy": "least-loaded", "planner": "chunked"},
}
# Requests/s per instance where the search starts (near hfx's knee, bench/sim/prefix_hits.py).
START = {"trace": 1.5, "agent-loops": 0.6, "shared-prompts": 1.3, "chat-sessions": 8.0}
DURATION, WARMUP = 600.0, 200.0


def config(name: str, workload: str, trace: str, instances: int, seed: int,
           duration: float = DURATION, warmup: float = WARMUP) -> SimConfig:
    fields: dict[str, Any] = {**CONTENDERS[name], "instances": instances, "seed": seed}
    rate = START[workload] * instances
    if workload == "trace":
        fields |= {"workload": trace, "trace_qps": rate, "slo_map": "default=2000:500"}
    else:
        fields |= {"workload": workload, "qps": rate, "duration": duration, "warmup": warmup}
    return SimConfig(**fields)


def crossings(files: list[str]) -> None:
    """The 90% crossing of each contender, interpolated between the bisection's probes
    (``hfx.evaluation.capacity.crossing``; the rows keep every probe), mean over the seeds of
    the runs given together, and HFX's over the best other's, per workload and metric."""
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    commits = set()
    for f in files:
        run = json.loads(Path(f).read_text())
        commits.add(run.get("commit"))
        for r in run["rows"]:
            for m, key in (("eq4", "attainment"), ("deadline", "attainment_dslo")):
                scores = {p["qps"]: p[key] for p in r["probes"]}
                x = crossing(scores, r[f"capacity_{m}"], 0.9)
                found.setdefault((r["workload"], m), {}).setdefault(r["contender"], []).append(x)
    print(f"commits: {', '.join(sorted(str(c) for c in commits))}")
    for (w, m), by in found.items():
        mean = {n: statistics.fmean(v) for n, v in by.items()}
        line = "  ".join(f"{n} {v:.1f} ({len(by[n])} seeds)" for n, v in mean.items())
        peers = {n: v for n, v in mean.items() if not n.startswith("hfx")}
        if peers and "hfx" in mean:
            best = max(peers, key=lambda n: peers[n])
            line += f"  | hfx / {best} = {mean['hfx'] / peers[best]:.2f}"
        print(f"{w:15s} {m:8s} {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crossings", nargs="+", metavar="JSON",
                    help="print the 90%% crossings of these earlier runs and exit")
    ap.add_argument("--trace")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--workloads", default="trace,agent-loops")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first-seed .. first-seed + seeds - 1 (another run's seeds added)")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--duration", type=float, default=DURATION,
                    help="seconds simulated of a session kind (not the trace), warm-up included")
    ap.add_argument("--warmup", type=float, default=WARMUP)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.crossings:
        crossings(args.crossings)
        return 0
    if not args.trace:
        ap.error("--trace is required")
    names, workloads = args.contenders.split(","), args.workloads.split(",")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    cells = [(w, n, s) for w in workloads for n in names for s in seeds]
    found = run_all(dual_capacity, [(config(n, w, args.trace, args.instances, s, args.duration,
                                            args.warmup), 0.9, args.tolerance)
                                     for w, n, s in cells], args.jobs, desc="capacity")
    rows = []
    for (w, n, s), f in zip(cells, found, strict=True):
        hits = {m: next((p["hit_rate"] for p in f["probes"] if p["qps"] == f[m]), None)
                for m in ("eq4", "deadline")}
        rows.append({"workload": w, "contender": n, "seed": s, "capacity_eq4": f["eq4"],
                     "capacity_deadline": f["deadline"], "hit_rate_at_capacity": hits,
                     "probes": f["probes"]})
    out = {"command": "python bench/sim/prefix_routers.py " + " ".join(sys.argv[1:]),
           "commit": code_commit(),
           "python": platform.python_version(), "instances": args.instances,
           "contenders": {n: CONTENDERS[n] for n in names}, "duration": args.duration,
           "warmup": args.warmup, "rows": rows, "summary": {}}
    for w in workloads:
        mean = {n: {m: statistics.fmean(r[f"capacity_{m}"] for r in rows
                                        if r["workload"] == w and r["contender"] == n)
                    for m in ("eq4", "deadline")} for n in names}
        out["summary"][w] = mean
        for m in ("eq4", "deadline"):
            peers = {n: v[m] for n, v in mean.items() if not n.startswith("hfx")}
            line = "  ".join(f"{n} {v[m]:.3g}" for n, v in mean.items())
            # A run of some contenders only (a row rerun) may have no peer or no hfx.
            best = max(peers, key=lambda n: peers[n]) if peers else None
            if best is not None and "hfx" in mean and peers[best]:
                line += f"  | hfx / best peer ({best}) = {mean['hfx'][m] / peers[best]:.2f}"
            print(f"{w:15s} {m:8s} {line}", flush=True)
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
