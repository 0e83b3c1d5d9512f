"""Sustained capacity of every policy on each workload: one table per workload.

Each (workload, policy, seed) is one ``hfx.evaluation.capacity.seed_capacity`` search —
bracketing then bisection over steady-state runs (300 s of Poisson arrivals after a 60 s
warm-up, a 60 s drain whose leftovers are misses, step-time noise on) — for the highest QPS at
90% attainment; the searches run in a process pool. Reported per workload and policy: the mean
and standard deviation over seeds, in requests/s for the 2-instance fleet.

    python bench/experiments/capacity_table.py --json docs/results/capacity.json
    python bench/experiments/capacity_table.py --workloads wikisql --policies hfx,rr --seeds 2
    # a paper figure's series and fleet, at steady state (one table each):
    python bench/experiments/capacity_table.py --presets fig4-four-task,fig5-four-task
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.evaluation.capacity import over_seeds, seed_capacity, steady
from hfx.evaluation.compare import WORKLOAD_CONFIG
from hfx.evaluation.presets import PRESETS, SEED_DISPATCHER

# Where each search starts (requests/s for 2 instances): near the knee, to save probes.
START = {"four-task": 100.0, "two-task": 100.0, "wikisql": 8.0, "tiered-512-512": 40.0,
         "tiered-4096-1024": 4.0}
POLICIES = ("hfx", "slos-serve", "polyserve", "sa", "scorpio", "aladdin", "least-loaded", "rr")
# A series: a label and the config fields it sets.
VARIANTS = {"hfx+deadline-chunked": {"policy": "hfx", "planner": "deadline-chunked",  # default
                                     "policy_params": {"override": "on"}},
            # The default before the override (issue 17's first tables).
            "hfx+tpot-chunked": {"policy": "hfx", "planner": "tpot-chunked",
                                 "policy_params": SEED_DISPATCHER},
            "hfx+prefill-first": {"policy": "hfx", "planner": "prefill-first",  # the seed's
                                  "policy_params": SEED_DISPATCHER},
            # HFX as it ships with admission's wait bound: a request still without a
            # first token 10 s past its TTFT is shed (a miss either way), so none waits unbounded.
            "hfx+max-wait-10": {"policy": "hfx", "planner": "deadline-chunked",
                                "policy_params": {"override": "on"}, "max_wait": 10.0},
            # Without Eq. 5's budget and Algorithm 1's payback (hfx's tpot_guard), both engines.
            "hfx+guard-off": {"policy": "hfx", "policy_params": {"tpot_guard": "off"}},
            "hfx+prefill-first+guard-off": {"policy": "hfx", "planner": "prefill-first",
                                            "policy_params": {"tpot_guard": "off"}}}


def series_fields(name: str) -> dict:
    return VARIANTS.get(name, {"policy": name})


# Presets whose load is not a steady rate: nothing to bisect. (The ramp and the burst are
# docs/results.md's Experiments 5 and 10; PolyServe's 20-instance settings are the tiered
# workloads above, on 2 instances.)
NOT_STEADY = ("polyserve-512", "polyserve-4096")


def workload_tasks(workload: str, names: list[str]) -> list[tuple[str, str, dict, float]]:
    """(table, series, config fields, start QPS) of each series on a workload."""
    return [(workload, n, {"workload": workload, **WORKLOAD_CONFIG.get(workload, {}),
                           **series_fields(n)}, START.get(workload, 20.0)) for n in names]


def preset_tasks(name: str) -> list[tuple[str, str, dict, float]]:
    """A paper figure at steady state: the preset's series on its fleet and engine (its table
    is named after it); the search starts mid-grid."""
    if name in NOT_STEADY:
        raise SystemExit(f"{name}: not a steady-state setting ({', '.join(NOT_STEADY)})")
    preset = PRESETS[name]
    start = float(sorted(preset.qps)[len(preset.qps) // 2])
    return [(name, label, {"workload": preset.workload, **preset.config, **fields}, start)
            for label, fields in preset.series]


def one(table: str, name: str, fields: dict, start: float, seed: int,
        tolerance: float) -> tuple[str, str, dict]:
    config = steady(SimConfig(**{**fields, "qps": start, "seed": seed}))
    t0 = time.perf_counter()
    result = seed_capacity(config, 0.9, tolerance)
    result["wall_seconds"] = time.perf_counter() - t0
    return table, name, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="four-task,two-task,wikisql,tiered-512-512")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"policies, or variants ({', '.join(VARIANTS)})")
    ap.add_argument("--presets", default=None,
                    help="instead of --workloads/--policies: paper-figure presets (hfx list), "
                         "each series on the preset's fleet")
    ap.add_argument("--series", default=None,
                    help="with --presets: only these series (comma-separated labels)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--json", default=None)
    ap.add_argument("--render", nargs="+", metavar="JSON",
                    help="print one markdown table from these results (later files win) and "
                         "exit")
    args = ap.parse_args()
    if args.render:
        print(render(args.render))
        return 0
    if args.series and not args.presets:
        ap.error("--series picks series of --presets; with --workloads, use --policies")
    if args.presets:
        series = [t for p in args.presets.split(",") for t in preset_tasks(p)]
        if args.series:
            keep = set(args.series.split(","))
            series = [t for t in series if t[1] in keep]
            if not series:
                raise SystemExit(f"no series {args.series!r} in {args.presets}")
    else:
        names = args.policies.split(",")
        series = [t for w in args.workloads.split(",") for t in workload_tasks(w, names)]
    found: dict[tuple[str, str], list[dict]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, *task, seed, args.tolerance)
                   for task in series for seed in range(args.seeds)]
        for fut in as_completed(futures):
            w, n, r = fut.result()
            found.setdefault((w, n), []).append(r)
            print(f"{w:16s} {n:18s} seed {r['seed']}: {r['capacity']:7.2f} QPS "
                  f"({len(r['probes'])} probes, {r['wall_seconds']:.0f} s)", flush=True)
            if args.json:  # after every search: a long run stopped early keeps what it found
                write_json(args.json, report(args, found))
    for w, rows in report(args, found)["tables"].items():
        print(f"\n{w}: capacity at 90% attainment, QPS for its fleet, mean ± std over seeds")
        for n, row in sorted(rows.items(), key=lambda x: -x[1]["mean"]):
            print(f"  {n:18s} {row['mean']:7.2f} ± {row['std']:5.2f}   "
                  f"{', '.join(f'{c:.1f}' for c in row['per_seed'])}")
    return 0


def render(paths: list[str]) -> str:
    """Series × workload, mean ± std (per seed) in QPS for the fleet, best first on the first
    workload (series without it last)."""
    cells: dict[str, dict[str, dict]] = {}
    for path in paths:
        for w, rows in json.loads(Path(path).read_text())["tables"].items():
            for n, row in rows.items():
                cells.setdefault(n, {})[w] = row
    workloads = list(dict.fromkeys(w for row in cells.values() for w in row))
    first = workloads[0]
    order = sorted(cells, key=lambda n: -cells[n].get(first, {"mean": -1.0})["mean"])
    lines = ["| series | " + " | ".join(workloads) + " |",
             "| --- |" + " --- |" * len(workloads)]
    for n in order:
        out = []
        for w in workloads:
            r = cells[n].get(w)
            out.append("–" if r is None else f"{r['mean']:.1f} ± {r['std']:.1f} ("
                       + ", ".join(f"{c:.4g}" for c in r["per_seed"]) + ")")
        lines.append(f"| {n} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def report(args: argparse.Namespace, found: dict[tuple[str, str], list[dict]]) -> dict:
    tables: dict[str, dict] = {}
    for (w, n), runs in sorted(found.items()):
        tables.setdefault(w, {})[n] = {**over_seeds(runs),
                                       "seeds": sorted(runs, key=lambda r: r["seed"])}
    base = steady(SimConfig())
    # The options that shape the results: --jobs does not, and --presets replaces the others.
    skip = {"json", "render", "jobs"} | ({"workloads", "policies"} if args.presets
                                         else {"presets"})
    if not args.series:
        skip.add("series")
    return {"command": "python bench/experiments/capacity_table.py " + " ".join(
                f"--{k} {shlex.quote(str(v))}" for k, v in vars(args).items() if k not in skip),
            "duration": base.duration, "warmup": base.warmup, "drain": base.drain_seconds,
            "step_noise": base.step_noise, "target": 0.9, "tolerance": args.tolerance,
            "workload_config": WORKLOAD_CONFIG,
            "tables": tables}


if __name__ == "__main__":
    raise SystemExit(main())
