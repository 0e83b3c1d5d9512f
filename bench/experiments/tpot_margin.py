"""HFX's capacity with its TPOT guard aimed at a share of each target (``tpot_margin``): each
cell's search under both metrics, as compare.py runs HFX's (its table's setting, its engine),
once per margin. Writes JSON; not a test.

    python bench/experiments/tpot_margin.py --margins 1.0,0.95,0.9,0.85 \
        --cells slos-serve-mixed@2:100 --run tuning --jobs 2 \
        --json docs/data/tpot_margin/held_out.json
    python bench/experiments/tpot_margin.py --margins 1.0,0.9 \
        --cells tiered-512-512@20:0,1 --table compare_whole/own_engines_1024_20 \
        --jobs 2 --json docs/data/tpot_margin/tiered_20.json

A cell is ``WORKLOAD@INSTANCES:SEEDS``. Each search starts warm where the table found HFX (the
same workload, fleet and seed; ``--warm`` names another table), else where compare.py starts
it. ``--run tuning`` probes as the tuning does (90 s after 20 s), ``evaluation`` as the tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hfx.evaluation import code_commit, write_json
from hfx.evaluation.compare import EVALUATION_RUN, TUNING_RUN, _search

ROOT = Path(__file__).resolve().parents[2]
RUNS = {"evaluation": EVALUATION_RUN, "tuning": TUNING_RUN}


def search(workload: str, instances: int, seed: int, margin: str | float,
           setting: dict[str, Any],
           engine: str | None, regime: int, run: dict[str, float],
           warm: dict[str, float] | None) -> dict[str, Any]:
    setting = {**setting, "policy_params": {**setting.get("policy_params", {}),
                                            "tpot_margin": margin}}
    fields = {"workload": workload, "seed": seed, "instances": instances, "max_num_seqs": regime}
    found = _search("hfx", setting, run, fields, engine=engine, warm=warm)  # compare.py's own
    return {"workload": workload, "instances": instances, "seed": seed, "margin": margin,
            **found}


def share(text: str) -> str | float:
    """A ``tpot_margin``: "learned", "off", or a fixed share."""
    try:
        return float(text)
    except ValueError:
        return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--margins", default="off,learned",
                    help="tpot_margin values: learned, off (the seed's) or a share")
    ap.add_argument("--cells", required=True, help="WORKLOAD@INSTANCES:SEED,SEED;...")
    ap.add_argument("--table", default="compare_whole/own_engines_1024",
                    help="the table (under docs/data) whose HFX setting and engine run")
    ap.add_argument("--warm", default=None, help="the table to start searches from "
                    "(default: --table)")
    ap.add_argument("--regime", type=int, default=1024)
    ap.add_argument("--run", choices=sorted(RUNS), default="evaluation")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    table = json.loads((ROOT / "docs/data" / f"{args.table}.json").read_text())
    setting = table["tuning"]["hfx"][str(args.regime)]["chosen"]
    engine = table["protocol"]["engine"]
    warm_table = (json.loads((ROOT / "docs/data" / f"{args.warm}.json").read_text())
                  if args.warm else table)
    found = {(r["workload"], r.get("instances", 2), r["seed"]): r
             for r in warm_table["searches"]
             if r["contender"] == "hfx" and r["regime"] == args.regime}
    calls = []
    for cell in args.cells.split(";"):
        workload, rest = cell.split("@")
        instances, seeds = rest.split(":")
        for seed in seeds.split(","):
            key = (workload, int(instances), int(seed))
            warm = ({m: found[key][m] for m in ("eq4", "deadline")} if key in found else None)
            for margin in args.margins.split(","):
                calls.append((workload, int(instances), int(seed), share(margin), setting,
                              engine, args.regime, RUNS[args.run], warm))
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(search, *zip(*calls, strict=True)))
    for r in rows:
        print(f"{r['workload']}@{r['instances']} seed {r['seed']} margin {r['margin']}: "
              f"eq4 {r['eq4_crossing']:.1f}, per token {r['deadline_crossing']:.1f}",
              file=sys.stderr)
    write_json(args.json, {"command": " ".join(["python", *sys.argv]), "commit": code_commit(),
                           "date": datetime.date.today().isoformat(), "table": args.table,
                           "engine": engine, "setting": setting, "run": args.run,
                           "searches": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
