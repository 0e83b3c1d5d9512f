"""HFX's capacity under variants of its policy parameters: each cell's search under both
metrics, as compare.py runs HFX's (its table's setting, its engine), once per variant. Writes
JSON; not a test.

    python bench/experiments/hfx_params.py --variants "base;guard_tpots=keepable" \
        --cells "tiered-512-512@20:0,1;tiered-4096-1024@20:0,1" \
        --table compare_whole/own_engines_1024 --warm compare_whole/own_engines_1024_20 \
        --jobs 2 --json /tmp/keepable_20.json

A variant is ``K=V,K=V`` over the table's chosen setting (``base``: the setting as it is). A
cell is ``WORKLOAD@INSTANCES:SEEDS``. Each search starts warm where compare.py's rerun of the
table would start HFX's (its crossings on the same workload and seed, in proportion to the
fleet; ``--warm`` names another table), else where compare.py starts it cold. ``--run
tuning`` probes as the tuning does (90 s after 20 s), ``evaluation`` as the tables.
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
from hfx.evaluation.compare import EVALUATION_RUN, TUNING_RUN, _search, earlier_searches

ROOT = Path(__file__).resolve().parents[2]
RUNS = {"evaluation": EVALUATION_RUN, "tuning": TUNING_RUN}


def value(text: str) -> str | float:
    """A parameter's value: a number where it reads as one, else the text."""
    try:
        return float(text)
    except ValueError:
        return text


def variant(text: str) -> dict[str, str | float]:
    """``K=V,K=V`` (``base``: none) as policy parameters."""
    if text.strip() in ("", "base"):
        return {}
    return {k.strip(): value(v.strip()) for k, v in (kv.split("=", 1) for kv in text.split(","))}


def search(workload: str, instances: int, seed: int, params: dict[str, Any],
           setting: dict[str, Any], engine: str | None, regime: int, run: dict[str, float],
           warm: dict[str, float] | None) -> dict[str, Any]:
    setting = {**setting, "policy_params": {**setting.get("policy_params", {}), **params}}
    fields = {"workload": workload, "seed": seed, "instances": instances, "max_num_seqs": regime}
    found = _search("hfx", setting, run, fields, engine=engine, warm=warm)  # compare.py's own
    return {"workload": workload, "instances": instances, "seed": seed, "params": params,
            **found}


def run_variants(variants: list[dict[str, Any]], cells: str, table_name: str,
                 warm_name: str | None, regime: int, run: str, jobs: int) -> dict[str, Any]:
    """Every cell's search under every variant; the JSON's body."""
    table = json.loads((ROOT / "docs/data" / f"{table_name}.json").read_text())
    setting = table["tuning"]["hfx"][str(regime)]["chosen"]
    engine = table["protocol"]["engine"]
    warm_table = (json.loads((ROOT / "docs/data" / f"{warm_name}.json").read_text())
                  if warm_name else table)
    calls = []
    for cell in cells.split(";"):
        workload, rest = cell.split("@")
        instances, seeds = rest.split(":")
        # Where compare.py's own rerun of the table would start each search: the crossings.
        found = earlier_searches(warm_table, int(instances))
        for seed in seeds.split(","):
            warm = found.get(("hfx", workload, int(seed), regime))
            for params in variants:
                calls.append((workload, int(instances), int(seed), params, setting, engine,
                              regime, RUNS[run], warm))
    with ProcessPoolExecutor(jobs) as pool:
        rows = list(pool.map(search, *zip(*calls, strict=True)))
    for r in rows:
        print(f"{r['workload']}@{r['instances']} seed {r['seed']} {r['params']}: "
              f"eq4 {r['eq4_crossing']:.2f}, per token {r['deadline_crossing']:.2f}",
              file=sys.stderr)
    return {"command": " ".join(["python", *sys.argv]), "commit": code_commit(),
            "date": datetime.date.today().isoformat(), "table": table_name, "engine": engine,
            "setting": setting, "run": run, "searches": rows}


def add_search_args(ap: argparse.ArgumentParser) -> None:
    """The cells, table, run and output options (this script's and tpot_margin.py's)."""
    ap.add_argument("--cells", required=True, help="WORKLOAD@INSTANCES:SEED,SEED;...")
    ap.add_argument("--table", default="compare_whole/own_engines_1024",
                    help="the table (under docs/data) whose HFX setting and engine run")
    ap.add_argument("--warm", default=None, help="the table to start searches from "
                    "(default: --table)")
    ap.add_argument("--regime", type=int, default=1024)
    ap.add_argument("--run", choices=sorted(RUNS), default="evaluation")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", required=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", required=True,
                    help="policy parameters per variant: K=V,K=V;K=V ('base': the setting alone)")
    add_search_args(ap)
    args = ap.parse_args()
    body = run_variants([variant(v) for v in args.variants.split(";")], args.cells,
                        args.table, args.warm, args.regime, args.run, args.jobs)
    write_json(args.json, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
