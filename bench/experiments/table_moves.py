"""What a rerun of comparison tables moved: for each table, every contender's mean capacity in
every cell before and after, HFX's ratio over the best peer and the cell's note, and each
tuning that chose another setting. Writes JSON; not a test.

    python bench/experiments/table_moves.py --before 5736969 \
        --tables compare_engine/vllm_1024,compare_whole/own_engines_1024 \
        --json docs/data/reproduce/rerun_moves.json

``--before`` is a git revision whose docs/data holds each table as it was; the tables after
are those in docs/data now (or ``--after DIR``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hfx.evaluation import write_json

ROOT = Path(__file__).resolve().parents[2]


def table_at(rev: str, table: str) -> dict[str, Any]:
    got = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:docs/data/{table}.json"],
                         capture_output=True, text=True, check=True)
    return json.loads(got.stdout)


def commits(result: dict[str, Any]) -> list[str]:
    return sorted({r.get("commit", "not recorded") for r in result["searches"]})


def moves(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Cell by cell (workload, sequences, metric): each contender's mean then and now."""
    old = {(c["workload"], c["regime"], c["metric"]): c for c in before["table"]}
    cells: dict[str, Any] = {}
    largest: dict[str, float] = {}
    for c in after["table"]:
        key = (c["workload"], c["regime"], c["metric"])
        was = old.get(key)
        if was is None:
            continue
        row: dict[str, Any] = {"hfx_over_best_peer": [was["hfx_over_best_peer"],
                                                      c["hfx_over_best_peer"]],
                               "best_peer": [was["best_peer"], c["best_peer"]],
                               "note": [was["note"], c["note"]], "capacities": {}}
        for name, cap in c["capacities"].items():
            then = was["capacities"].get(name, {}).get("mean")
            if not then:
                continue
            moved = cap["mean"] / then - 1
            row["capacities"][name] = {"before": round(then, 3), "after": round(cap["mean"], 3),
                                       "moved": round(moved, 4)}
            if abs(moved) > abs(largest.get(name, 0.0)):
                largest[name] = round(moved, 4)
        cells[" ".join(map(str, key))] = row
    retuned = {}
    for name, regimes in after.get("tuning", {}).items():
        for regime, tuning in regimes.items():
            then = before.get("tuning", {}).get(name, {}).get(regime, {}).get("chosen")
            if then is not None and then != tuning["chosen"]:
                retuned[f"{name}@{regime}"] = {"before": then, "after": tuning["chosen"]}
    return {"commits": [commits(before), commits(after)], "largest_move": largest,
            "retuned": retuned, "cells": cells}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the git revision of the tables before")
    ap.add_argument("--after", default=str(ROOT / "docs/data"), help="the tables after")
    ap.add_argument("--tables", required=True)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    out: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "tables": {}}
    for table in args.tables.split(","):
        after = json.loads((Path(args.after) / f"{table}.json").read_text())
        got = out["tables"][table] = moves(table_at(args.before, table), after)
        print(f"{table}: {got['commits'][0]} -> {got['commits'][1]}; largest moves "
              f"{got['largest_move']}; retuned {got['retuned']}", file=sys.stderr)
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
