"""Whole capacity searches of the comparison in two checkouts: capacities and crossings must be
identical; CPU time of each. Writes JSON; not a test.

Each search is ``hfx.evaluation.compare``'s own (``_search``: the evaluation run, both metrics
from one set of probes) for a contender with the setting a comparison JSON tuned it to, on that
JSON's engine and regime, each in a fresh process on its checkout (``git worktree add DIR
REV``), the two alternated. A change meant to save CPU and change no result is measured so:

    git worktree add /tmp/before HEAD~1
    python bench/sim/search_ab.py /tmp/before . --json docs/data/search_ab.json

With ``--warm`` the second side starts each search where the table's own search of it found
its capacity (compare.py ``--warm``); the two sides may then be one tree, and their crossings
differ by the interpolation between other probes (reported, not failed on):

    python bench/sim/search_ab.py . . --warm --json docs/data/search_ab_warm.json

With ``--warm both`` both sides start so: a change to how a warm search probes, measured as
the comparison runs it (``--table`` names the table the searches start from).

Each tree runs as Python, whatever ``HFX_NATIVE`` says.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from hfx.evaluation import write_json
from hfx.evaluation.compare import earlier_searches

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from hfx.evaluation.compare import EVALUATION_RUN, _search
name, setting, fields, engine, warm = json.loads(sys.argv[2])
c0 = time.process_time()
r = _search(name, setting, EVALUATION_RUN, fields, engine=engine, warm=warm)
print(json.dumps({"cpu_seconds": time.process_time() - c0,
                  **{k: r[k] for k in ("eq4", "eq4_crossing", "deadline", "deadline_crossing")},
                  "stopped": sum(p.get("stopped_at") is not None for p in r["probes"]),
                  "probes": len(r["probes"])}))
"""
RESULTS = ("eq4", "eq4_crossing", "deadline", "deadline_crossing")
# A spread of contenders and workloads: the costly searches (SA, SLOs-Serve, PolyServe) and
# cheap ones, on the table of vLLM's engine at 256 sequences.
CASES = ("sa:four-task:0", "rr:four-task:0", "polyserve:two-task:0", "hfx:four-task:0",
         "slos-serve:bursty-four-task:0", "scorpio:two-task:1", "sa:bursty-four-task:1",
         "aladdin:wikisql:0")


def one(tree: str, args: list) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(Path(tree).resolve()),
                           json.dumps(args)], capture_output=True, text=True, check=True,
                          cwd="/", env={**os.environ, "HFX_NATIVE": "0"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--table", default="docs/data/compare_engine/vllm_256.json",
                    help="a comparison JSON: its engine, its regime and each contender's "
                         "tuned setting")
    ap.add_argument("--case", action="append", default=None, metavar="CONTENDER:WORKLOAD:SEED")
    ap.add_argument("--warm", nargs="?", const="after", choices=("after", "both"),
                    help="the second side's searches (or both sides') start from the table's "
                         "crossings")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    table = json.loads(Path(args.table).read_text())
    engine = table["protocol"]["engine"]
    regime = table["protocol"]["regimes"][0]
    out: dict = {"command": "python bench/sim/search_ab.py " + " ".join(sys.argv[1:]),
                 "table": args.table, "engine": engine, "regime": regime, "cases": []}
    capacities = earlier_searches(table)  # each search's, where --warm starts it
    for case in args.case or CASES:
        name, workload, seed = case.split(":")
        setting = table["tuning"][name][str(regime)]["chosen"]
        call = [name, setting, {"workload": workload, "seed": int(seed),
                                "max_num_seqs": regime}, engine]
        earlier = capacities.get((name, workload, int(seed), regime))
        row = {"case": case, "setting": setting}
        order = ("before", "after") if len(out["cases"]) % 2 == 0 else ("after", "before")
        for tag in order:
            warm = earlier if args.warm == "both" or (args.warm and tag == "after") else None
            row[tag] = one(getattr(args, tag), [*call, warm])
        row["same"] = all(row["before"][k] == row["after"][k] for k in RESULTS)
        row["crossing_change"] = max(
            abs(row["after"][k] / row["before"][k] - 1) if row["before"][k] else 0.0
            for k in ("eq4_crossing", "deadline_crossing"))
        out["cases"].append(row)
        print(f"{case:32s} CPU {row['before']['cpu_seconds']:6.1f} -> "
              f"{row['after']['cpu_seconds']:6.1f} s; probes stopped "
              f"{row['after']['stopped']}/{row['after']['probes']}"
              + ("" if row["same"] else f"  crossing moved {row['crossing_change']:.1%}"),
              flush=True)
        if args.json:
            write_json(args.json, out)
    before = sum(c["before"]["cpu_seconds"] for c in out["cases"])
    after = sum(c["after"]["cpu_seconds"] for c in out["cases"])
    out["cpu_before"], out["cpu_after"] = before, after
    print(f"total CPU {before:.1f} -> {after:.1f} s ({1 - after / before:.0%} less)")
    if args.json:
        write_json(args.json, out)
    return 0 if args.warm or all(c["same"] for c in out["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
