"""The comparison protocol: every policy tuned on the same budget, then its capacity
on every workload × seed × engine regime under both SLO metrics (hfx/evaluation/compare.py).

    python bench/experiments/compare.py --json docs/data/compare.json  # the whole table
    python bench/experiments/compare.py --workloads four-task --seeds 0 \
        --contenders hfx,slos-serve,rr
    python bench/experiments/compare.py --render docs/data/compare.json  # the markdown table again
    python bench/experiments/compare.py --tuned docs/data/compare.json ...  # tuning from there
    python bench/experiments/compare.py --engine vllm --json docs/data/compare_vllm.json
        # dispatchers on the same engine: every contender on vLLM's planner
    python bench/experiments/compare.py --engine vllm --model llama-3-70b --hardware h200 \
        --tuned docs/data/compare_engine/vllm_1024.json ...  # a second model and hardware pair
    python bench/experiments/compare.py --engine vllm --regimes 1024 \
        --warm docs/data/compare_engine/vllm_1024.json ...  # rerun, each search started
        # where the last run found it
    python bench/experiments/compare.py --engine vllm --instances 16 \
        --tuned docs/data/compare_engine/vllm_1024.json ...  # a larger fleet
    python bench/experiments/compare.py --engine vllm --regimes 1024 --workloads none \
        --tuning-fleet qwen2.5-32b@h200 --json ...  # tuning only, held out by model and hardware

Each cell names its work bound and blind bound (hfx/evaluation/bound.py, computed when the
table is made): the most requests/s any dispatcher and engine could carry there, and the most
one that knows no output length before it ends could; and HFX's share of each. --render with
--json writes the result back with its table made anew (the bounds of this commit's code).
A table is rendered from searches of one commit only (each row names its commit); --render
--allow-mixed-commits prints one anyway, saying which contender ran at which.

The JSON holds the protocol, each contender's tuning (every setting's capacities and the one
chosen), every search with its probes, and the table; it is rewritten after tuning and after
each workload's searches, so a run stopped early keeps what it found.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hfx.engine.planners import PLANNERS
from hfx.evaluation import code_commit, write_json
from hfx.evaluation.compare import (
    CONTENDERS,
    EVALUATION_RUN,
    HELD_OUT,
    METRICS,
    REGIMES,
    SEEDS,
    TARGET,
    TUNING_RUN,
    TUNING_SEED,
    TUNING_WORKLOAD,
    WORKLOADS,
    cell_bounds,
    cells,
    evaluate,
    headline,
    one_commit,
    tune,
)
from hfx.stepmodel.profiles import shipped_profiles

ROOT = Path(__file__).resolve().parents[2]


def fleet_words(fleet: dict | None) -> str:
    """How a result's fleet reads in its rendered table's header."""
    fleet = fleet or {}
    model = (f"{fleet['model']} on {fleet['hardware']}" if "model" in fleet
             else "each workload's model")
    return f"{model}, {fleet.get('instances', 2)} instances"


def code_between(commits: set[str], root: Path = ROOT) -> str:
    """What the package (hfx/) differs in between a mixed table's commits: a cell is current
    at another commit only where none of its code is in this list."""
    known = sorted(c for c in commits if c != "not recorded")
    lines = []
    for a, b in itertools.pairwise(known):
        got = subprocess.run(["git", "-C", str(root), "diff", "--name-only", a, b, "--", "hfx"],
                             capture_output=True, text=True)
        files = got.stdout.split() if got.returncode == 0 else ["(not in this checkout)"]
        lines.append(f"hfx/ between {a} and {b}: {', '.join(files) or 'nothing'}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--regimes", default=",".join(map(str, REGIMES)),
                    help="max_num_seqs of each engine regime")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--ray-address", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--engine", choices=sorted(PLANNERS), default=None,
                    help="every contender on this engine planner (dispatchers on the same "
                    "engine); default: each on its own")
    ap.add_argument("--model", default=None,
                    help="every run on this model's shipped profile, with --hardware (a second "
                    "model and hardware pair); default: each workload's own")
    ap.add_argument("--hardware", default=None, help="the device of --model's profile")
    ap.add_argument("--instances", type=int, default=None,
                    help="every run on this many instances (each search starting at its "
                    "2-instance rate in proportion); default: 2")
    ap.add_argument("--tuning-fleet", metavar="MODEL@HARDWARE", default=None,
                    help="tune on this shipped profile's model and hardware instead of the "
                    "evaluated fleet's (a tuning held out by model and hardware); "
                    "'--workloads none' then tunes only")
    ap.add_argument("--tuning-workload", default=TUNING_WORKLOAD,
                    choices=(TUNING_WORKLOAD, HELD_OUT),
                    help=f"tune on this workload; {HELD_OUT} is held out by task, length and "
                    "SLO (six-task holds the evaluated tasks); '--workloads none' then tunes only")
    ap.add_argument("--render", metavar="JSON", help="print the table of a result and exit")
    ap.add_argument("--allow-mixed-commits", action="store_true",
                    help="render a table whose searches ran at different commits")
    ap.add_argument("--merge", metavar="JSON",
                    help="keep the other contenders' tuning and searches from this earlier "
                    "result (their code unchanged since), and run only --contenders")
    ap.add_argument("--warm", metavar="JSON", help="start each search just below the capacity "
                    "this earlier result of the same table found for it (a third of the probes "
                    "where it is unchanged; one of another fleet size in proportion); default: "
                    "every search from its workload's rate")
    ap.add_argument("--tuned", metavar="JSON", help="take the tuning from this earlier result "
                    "instead of tuning again")
    args = ap.parse_args()
    if args.render:
        result = json.loads(Path(args.render).read_text())
        try:
            print(f"commit {one_commit(result['searches'])}")
        except ValueError as e:
            if not args.allow_mixed_commits:
                print(f"not rendered: {e}", file=sys.stderr)
                return 1
            print(f"mixed commits: {e}")
            print(code_between({r.get("commit", "not recorded") for r in result["searches"]}))
        protocol = result.get("protocol", {})
        print(f"engine {protocol.get('engine') or 'each its own'}; "
              f"fleet {fleet_words(protocol.get('fleet'))}")
        result["table"] = cells(result["searches"], cell_bounds(result["searches"]))
        print(headline(result["table"]))
        if args.json:  # the bounds are this code's: say which
            result["table_commit"] = code_commit()
            write_json(args.json, result)
        return 0
    fleet: dict[str, str | int] = {}
    if args.instances is not None:
        if args.instances < 1:
            ap.error("--instances must be at least 1")
        fleet["instances"] = args.instances
    if (args.model is None) != (args.hardware is None):
        ap.error("--model and --hardware go together")

    def profile(name: str) -> dict[str, str]:
        """A shipped profile's model and hardware, as fleet fields."""
        if name not in shipped_profiles():
            ap.error(f"no shipped profile {name}; choose from {', '.join(shipped_profiles())}")
        model, hardware = name.split("@")
        return {"model": model, "hardware": hardware}

    if args.model is not None:
        fleet.update(profile(f"{args.model}@{args.hardware}"))
    tuning_fleet = dict(fleet)
    if args.tuning_fleet is not None:
        tuning_fleet.update(profile(args.tuning_fleet))
    workloads = [] if args.workloads == "none" else args.workloads.split(",")
    names = args.contenders.split(",")
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        ap.error(f"unknown contenders {unknown}; choose from {', '.join(CONTENDERS)}")
    regimes = [int(r) for r in args.regimes.split(",")]
    out: dict = {
        "command": " ".join(["python", *sys.argv]),
        "protocol": {"target": TARGET, "metrics": METRICS, "regimes": regimes,
                     "engine": args.engine, "fleet": fleet or None,
                     "tuning_workload": args.tuning_workload, "tuning_seed": TUNING_SEED,
                     "tuning_fleet": tuning_fleet if tuning_fleet != fleet else None,
                     "tuning_run": TUNING_RUN, "evaluation_run": EVALUATION_RUN,
                     "contenders": {n: {"fields": CONTENDERS[n].fields, "help": CONTENDERS[n].help,
                                        "grid": list(CONTENDERS[n].grid_on(args.engine))}
                                    for n in names}},
    }
    warm = json.loads(Path(args.warm).read_text()) if args.warm else None
    # Read before anything is written: --merge and --json may name the same file.
    merged = json.loads(Path(args.merge).read_text()) if args.merge else None
    if args.warm:
        out["warm_from"] = args.warm
    t0 = time.perf_counter()
    if args.tuned:
        earlier = json.loads(Path(args.tuned).read_text())
        # The tuning taken is the earlier result's: so is the workload and seed it ran on.
        for field in ("tuning_workload", "tuning_seed", "tuning_fleet"):
            if field in earlier.get("protocol", {}):
                out["protocol"][field] = earlier["protocol"][field]
        out["tuning"] = {n: earlier["tuning"][n] for n in names}
        out["tuning_seconds"] = earlier.get("tuning_seconds")
        out["tuned_from"] = args.tuned
    else:
        out["tuning"] = tune(names, regimes, args.jobs, args.ray_address,
                             engine=args.engine, fleet=tuning_fleet, earlier=warm,
                             workload=args.tuning_workload)
        out["tuning_seconds"] = round(time.perf_counter() - t0)
    for n, by_regime in out["tuning"].items():
        for regime, t in by_regime.items():
            score = t["scores"][t["settings"].index(t["chosen"])]
            print(f"tuned {n:<12} @{regime}: {t['chosen']} (score {score:.1f}, best "
                  f"{max(t['scores']):.1f})", flush=True)
    rows: list[dict] = []
    if merged is not None:  # the others' results as they were: one table over every contender
        for n, t in merged["tuning"].items():
            if n not in names:
                out["tuning"][n] = t
                out["protocol"]["contenders"][n] = merged["protocol"]["contenders"][n]
        rows += [r for r in merged["searches"] if r["contender"] not in names]
        out["merged_from"] = {"file": args.merge, "command": merged.get("command"),
                              "contenders": sorted(set(out["tuning"]) - set(names))}
        if merged.get("merged_from"):  # what that result had merged in its turn
            out["merged_from"]["earlier"] = merged["merged_from"]
        # Every run whose searches the table now holds, oldest first: the one line of
        # provenance a reader of the table follows.
        out["commands"] = [*(merged.get("commands") or [merged.get("command")]), out["command"]]
        out["searches"] = list(rows)
        out["table"] = cells(rows, cell_bounds(rows))
    if args.json:
        write_json(args.json, out)
    t1 = time.perf_counter()
    for workload in workloads:
        rows += evaluate({n: out["tuning"][n] for n in names}, [workload],
                         [int(s) for s in args.seeds.split(",")],
                         regimes, args.jobs, args.ray_address, engine=args.engine,
                         fleet=fleet, earlier=warm)
        out["evaluation_seconds"] = round(time.perf_counter() - t1)
        out["searches"] = rows
        out["table"] = cells(rows, cell_bounds(rows))
        print(headline([c for c in out["table"] if c["workload"] == workload]), flush=True)
        if args.json:
            write_json(args.json, out)
    if workloads:
        print(headline(out["table"]))
        print(f"tuning {out['tuning_seconds']} s, evaluation {out['evaluation_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
