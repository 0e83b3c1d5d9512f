"""Tune every contender on the held-out workload and say where it chooses otherwise than the
tables' tuning on six-task (issue 49: a tuning workload unlike the evaluated ones).

    python bench/experiments/held_out_tuning.py --out docs/data/tuning_held_out \
        --against docs/data --jobs 2 --json docs/data/tuning_held_out.json

For each table whose tuning the others take (full_run.py's first six), ``compare.py
--workloads none --tuning-workload slos-serve-mixed`` tunes every contender (or
``--contenders``) on that table's engine and regime, cold, and the summary lists each
contender's choice beside the table's. Where the two agree, the table's cells stand under the
held-out tuning. With ``--evaluate DIR`` the contenders whose choice differs are searched
again with it (``compare.py --tuned --merge``, warm from the table) and the table under the
held-out tuning is written to DIR; ``--reuse`` takes the tunings already in OUT.

    python bench/experiments/held_out_tuning.py --out docs/data/tuning_held_out \
        --against docs/data --reuse --evaluate docs/data/compare_held_out --jobs 2 \
        --json docs/data/compare_held_out/run.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from hfx.evaluation.compare import HELD_OUT


def _full_run_tables() -> list[tuple[str, list[str], str | None]]:
    """full_run.py's tables, from the file beside this one (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("full_run", Path(__file__).with_name(
        "full_run.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TABLES


# The tables whose tuning every other table takes, with the compare.py arguments that name
# their engine and regime.
TUNED_TABLES: dict[str, list[str]] = {
    t: args for t, args, tuned in _full_run_tables() if tuned is None}


def agreement(held: dict, table: dict) -> list[dict]:
    """Per contender and regime, the setting each tuning chose and whether they agree."""
    rows = []
    for name, by_regime in held["tuning"].items():
        for regime, t in by_regime.items():
            theirs = table["tuning"].get(name, {}).get(regime)
            rows.append({"contender": name, "regime": int(regime), "held_out": t["chosen"],
                         "six_task": theirs["chosen"] if theirs else None,
                         "agree": theirs is not None and theirs["chosen"] == t["chosen"],
                         "held_out_scores": t["scores"],
                         "settings": t["settings"]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the folder each tuning's JSON goes to")
    ap.add_argument("--against", required=True,
                    help="the folder of the tables whose six-task tuning it is compared with")
    ap.add_argument("--tables", default=",".join(TUNED_TABLES))
    ap.add_argument("--contenders", default=None, help="default: every contender")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None, help="the summary")
    ap.add_argument("--reuse", action="store_true",
                    help="take each table's held-out tuning from OUT instead of tuning again")
    ap.add_argument("--evaluate", metavar="DIR", default=None,
                    help="search the contenders whose choice differs again with it, each "
                    "table under the held-out tuning written here")
    args = ap.parse_args()
    chosen = args.tables.split(",")
    unknown = [t for t in chosen if t not in TUNED_TABLES]
    if unknown:
        ap.error(f"unknown tables {unknown}; choose from {', '.join(TUNED_TABLES)}")
    here = Path(__file__).resolve().parent
    summary: dict = {"command": " ".join(["python", *sys.argv]), "workload": HELD_OUT,
                     "tables": []}
    for table in chosen:
        target = Path(args.out) / f"{table}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(here / "compare.py"), *TUNED_TABLES[table],
               "--workloads", "none", "--tuning-workload", HELD_OUT, "--jobs", str(args.jobs),
               "--json", str(target)]
        if args.contenders:
            cmd += ["--contenders", args.contenders]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        if not (args.reuse and target.exists()):
            print(f"== {table}: {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, check=True)
        held = json.loads(target.read_text())
        table_json = Path(args.against) / f"{table}.json"
        rows = agreement(held, json.loads(table_json.read_text()))
        entry: dict = {"table": table, "command": held["command"], "contenders": rows}
        for r in rows:
            mark = "same" if r["agree"] else "DIFFERS"
            print(f"   {r['contender']:<12} @{r['regime']}: {mark}: held out {r['held_out']}, "
                  f"six-task {r['six_task']}", flush=True)
        differ = sorted({r["contender"] for r in rows if not r["agree"]})
        if args.evaluate and differ:
            evaluated = Path(args.evaluate) / f"{table}.json"
            evaluated.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(here / "compare.py"), *TUNED_TABLES[table],
                   "--tuning-workload", HELD_OUT, "--tuned", str(target),
                   "--contenders", ",".join(differ),
                   "--merge", str(table_json), "--warm", str(table_json),
                   "--jobs", str(args.jobs), "--json", str(evaluated)]
            print(f"== {table} evaluated: {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, check=True)
            entry["evaluated"] = str(evaluated)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        entry["cpu_seconds"] = round(after.ru_utime + after.ru_stime
                                     - before.ru_utime - before.ru_stime)
        entry["wall_seconds"] = round(time.perf_counter() - t0)
        summary["tables"].append(entry)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
