"""The whole comparison of docs/results.md in one command: every table's compare.py run, in
order, each table's CPU time (its process and the workers it reaped) and wall time measured.

    python bench/experiments/full_run.py --out /tmp/full --json /tmp/full/run.json
    python bench/experiments/full_run.py --out /tmp/full --warm docs/data  # each search
        # started where the table of the same name there found it (compare.py --warm)
    python bench/experiments/full_run.py --tables compare_engine/vllm_1024 ...
    python bench/experiments/full_run.py --out docs/data --warm docs/data --merge docs/data \
        --contenders hfx,hfx-paper  # rerun these in every table, the others kept as they are

Each table is written to OUT/<table>.json; the tables of the second model and hardware pair
and of larger fleets take their tuning from their first table's new result (held out by
model, hardware and fleet size, as docs/results.md describes). A table whose commit differs
from the others' fails the run: every table at one commit (issue 49). With ``--merge`` only
``--contenders`` run, each table keeping the others' searches from the table of the same name
in the merge folder (``compare.py --merge``: for contenders whose code has not changed), and
only the rerun contenders' commits must agree.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

SECOND_PAIR = ["--model", "llama-3-70b", "--hardware", "h200",
               "--workloads", "four-task,two-task,bursty-four-task,wikisql"]
# (table, compare.py's arguments, the table whose tuning it takes); in the order they run.
TABLES: list[tuple[str, list[str], str | None]] = [
    ("compare_engine/vllm_1024", ["--engine", "vllm", "--regimes", "1024"], None),
    ("compare_engine/deadline_chunked_1024",
     ["--engine", "deadline-chunked", "--regimes", "1024"], None),
    ("compare_engine/vllm_256", ["--engine", "vllm", "--regimes", "256"], None),
    ("compare_engine/deadline_chunked_256",
     ["--engine", "deadline-chunked", "--regimes", "256"], None),
    ("compare_whole/own_engines_1024", ["--regimes", "1024"], None),
    ("compare_whole/own_engines_256", ["--regimes", "256"], None),
    ("compare_engine/vllm_1024_llama-3-70b_h200", ["--engine", "vllm", "--regimes", "1024",
                                                   *SECOND_PAIR], "compare_engine/vllm_1024"),
    ("compare_engine/deadline_chunked_1024_llama-3-70b_h200",
     ["--engine", "deadline-chunked", "--regimes", "1024", *SECOND_PAIR],
     "compare_engine/deadline_chunked_1024"),
    # Larger fleets, seeds 0-1 (each probe carries 8-10x the requests of 2 instances):
    # dispatchers on vLLM's engine at 16 instances; PolyServe's own setting, 20 instances
    # of Llama-3.1-8B on H200 on its tiered workloads (PolyServe §5.1), each system on its
    # paper's engine.
    ("compare_engine/vllm_1024_16", [
        "--engine", "vllm", "--regimes", "1024", "--instances", "16", "--seeds", "0,1",
        "--workloads", "four-task,wikisql,two-task,bursty-four-task"],
     "compare_engine/vllm_1024"),
    ("compare_whole/own_engines_1024_20", [
        "--regimes", "1024", "--instances", "20", "--seeds", "0,1",
        "--workloads", "tiered-512-512,tiered-4096-1024"], "compare_whole/own_engines_1024"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the folder each table's JSON goes to")
    ap.add_argument("--warm", metavar="DIR", default=None,
                    help="start each table's searches from the JSON of the same name here")
    ap.add_argument("--tables", default=",".join(t for t, _, _ in TABLES))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None, help="the run's summary: each table's times")
    ap.add_argument("--contenders", default=None,
                    help="run only these (compare.py --contenders); default: every contender")
    ap.add_argument("--merge", metavar="DIR", default=None,
                    help="keep the other contenders' searches from the table of the same name "
                    "here (compare.py --merge); needs --contenders")
    args = ap.parse_args()
    known = {t: (a, tuned) for t, a, tuned in TABLES}
    chosen = args.tables.split(",")
    unknown = [t for t in chosen if t not in known]
    if unknown:
        ap.error(f"unknown tables {unknown}; choose from {', '.join(known)}")
    if args.merge and not args.contenders:
        ap.error("--merge reruns only --contenders: name them")
    # The contenders whose commits must agree: with --merge, the others keep their own.
    rerun = set(args.contenders.split(",")) if args.merge else None
    out = Path(args.out)
    here = Path(__file__).resolve().parent
    summary: dict = {"command": " ".join(["python", *sys.argv]), "tables": []}
    commits: set[str] = set()
    for table in chosen:
        extra, tuned_from = known[table]
        target = out / f"{table}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(here / "compare.py"), *extra, "--jobs", str(args.jobs),
               "--json", str(target)]
        if tuned_from is not None:
            cmd += ["--tuned", str(out / f"{tuned_from}.json")]
        warm = Path(args.warm) / f"{table}.json" if args.warm else None
        if warm is not None and not warm.exists() and tuned_from is not None:
            warm = Path(args.warm) / f"{tuned_from}.json"  # a larger fleet: in proportion
        if warm is not None and warm.exists():
            cmd += ["--warm", str(warm)]
        if args.contenders:
            cmd += ["--contenders", args.contenders]
        if args.merge:
            cmd += ["--merge", str(Path(args.merge) / f"{table}.json")]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        print(f"== {table}: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = json.loads(target.read_text())
        table_commits = {r.get("commit", "not recorded") for r in result["searches"]
                         if rerun is None or r["contender"] in rerun}
        commits |= table_commits
        summary["tables"].append({
            "table": table, "command": result["command"],
            "cpu_seconds": round(after.ru_utime + after.ru_stime
                                 - before.ru_utime - before.ru_stime),
            "wall_seconds": round(time.perf_counter() - t0),
            "tuning_seconds": result.get("tuning_seconds"),
            "searches": len(result["searches"]),
            "probes": sum(len(r["probes"]) for r in result["searches"]),
            "commits": sorted(table_commits)})
        summary["cpu_seconds"] = sum(t["cpu_seconds"] for t in summary["tables"])
        summary["wall_seconds"] = sum(t["wall_seconds"] for t in summary["tables"])
        summary["commits"] = sorted(commits)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
        print(f"== {table}: {summary['tables'][-1]['cpu_seconds']} CPU-s, "
              f"{summary['tables'][-1]['wall_seconds']} s", flush=True)
        if len(commits) > 1:
            print(f"tables ran at different commits: {sorted(commits)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
