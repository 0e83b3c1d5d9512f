"""Tune every contender on the held-out workload and say where it chooses otherwise than the
tables' tuning on six-task (issue 49: a tuning workload unlike the evaluated ones).

    python bench/experiments/held_out_tuning.py --out docs/data/tuning_held_out \
        --against docs/data --jobs 2 --json docs/data/tuning_held_out.json

For each table whose tuning the others take (full_run.py's first six), ``compare.py
--workloads none --tuning-workload slos-serve-mixed`` tunes every contender (or
``--contenders``) on that table's engine and regime, cold, and the summary lists each
contender's choice beside the table's. Where the two agree, the table's cells stand under the
held-out tuning; where they differ, that contender's cells of the table would be searched again
with the held-out choice (the summary says which).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from hfx.evaluation.compare import HELD_OUT

# The tables whose tuning every other table takes (bench/experiments/full_run.py), with the
# compare.py arguments that name their engine and regime.
TUNED_TABLES: dict[str, list[str]] = {
    "compare_engine/vllm_1024": ["--engine", "vllm", "--regimes", "1024"],
    "compare_engine/deadline_chunked_1024": ["--engine", "deadline-chunked", "--regimes", "1024"],
    "compare_engine/vllm_256": ["--engine", "vllm", "--regimes", "256"],
    "compare_engine/deadline_chunked_256": ["--engine", "deadline-chunked", "--regimes", "256"],
    "compare_whole/own_engines_1024": ["--regimes", "1024"],
    "compare_whole/own_engines_256": ["--regimes", "256"],
}


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
        print(f"== {table}: {' '.join(cmd[1:])}", flush=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        held = json.loads(target.read_text())
        against = json.loads((Path(args.against) / f"{table}.json").read_text())
        rows = agreement(held, against)
        summary["tables"].append({
            "table": table, "command": held["command"],
            "cpu_seconds": round(after.ru_utime + after.ru_stime
                                 - before.ru_utime - before.ru_stime),
            "wall_seconds": round(time.perf_counter() - t0), "contenders": rows})
        for r in rows:
            mark = "same" if r["agree"] else "DIFFERS"
            print(f"   {r['contender']:<12} @{r['regime']}: {mark}: held out {r['held_out']}, "
                  f"six-task {r['six_task']}", flush=True)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
