"""Whether this checkout reproduces a comparison table probe for probe. Writes JSON; not a test.

    python bench/experiments/reproduce.py --table compare_engine/vllm_1024 \
        --json docs/data/reproduce/vllm_1024.json

The table's run again (its compare.py arguments from full_run.py, its tuning where it takes
another table's), each search started where that run started it: ``--warm`` from the table
as it was before the run's result landed, found in git (the oldest version of the file whose
searches name the table's commit; its parent holds the input). Before anything runs, the
warm starts that input gives are checked against those the table recorded; then every tuning
and evaluation search's probes (rate, attainment under both metrics) and crossings are
compared with the table's. The simulator is deterministic, so a checkout whose changes claim
identical results (a cheaper structure, a compiled path) reproduces every search exactly;
one search that differs is a behaviour change, named with its probes. One table checks
every contender at that table's cost, where a full run redoes all ten
(``bench/experiments/full_run.py``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hfx.evaluation import code_commit, write_json
from hfx.evaluation.capacity import measured_bracket
from hfx.evaluation.compare import (
    EVALUATION_RUN,
    METRICS,
    TARGET,
    earlier_searches,
    earlier_tuning,
    one_commit,
    warm_start,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from full_run import TABLES  # type: ignore[import-not-found]  # noqa: E402  (a sibling script)


def git_show(rev: str, path: str, root: Path = ROOT) -> str | None:
    r = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True,
                       text=True)
    return r.stdout if r.returncode == 0 else None


def run_input(path: str, commit: str, root: Path = ROOT) -> tuple[str, dict]:
    """(the commit that landed ``path``'s searches of ``commit``, the file before it)."""
    revs = subprocess.run(["git", "-C", str(root), "log", "--format=%H", "--", path],
                          capture_output=True, text=True, check=True).stdout.split()
    landed = None
    for rev in revs:  # newest first: walk back while the file holds the same searches
        text = git_show(rev, path, root)
        if text is None:
            break
        searches = json.loads(text).get("searches", ())
        if not searches or {r.get("commit") for r in searches} != {commit}:
            break
        landed = rev
    if landed is None:
        raise SystemExit(f"{path}: no committed version holds searches of {commit}")
    before = git_show(f"{landed}^", path, root)
    if before is None:
        raise SystemExit(f"{path}: landed in {landed[:7]}, with no version before it")
    return landed, json.loads(before)


def _key(row: dict) -> tuple:
    """A search's cell, as compare.py keys it: (contender, workload, seed, regime)."""
    return (row["contender"], row["workload"], row["seed"], row["regime"])


def _probes(row: dict) -> list[tuple[float, float, float]]:
    return [(p["qps"], p["attainment"], p["attainment_dslo"]) for p in row["probes"]]


def _same(a: dict, b: dict) -> bool:
    return _probes(a) == _probes(b) and all(
        a.get(f"{m}_crossing") == b.get(f"{m}_crossing") for m in ("eq4", "deadline"))


def _bracketed(row: dict, metric: str) -> bool:
    key = METRICS[metric]
    return measured_bracket({p["qps"]: p[key] for p in row["probes"]}, TARGET,
                            EVALUATION_RUN["tolerance"]) is not None


def check_warm(table: dict, warm: dict, instances: int) -> list[str]:
    """The searches whose recorded warm start ``warm`` does not give (empty: it is the input)."""
    starts = earlier_searches(warm, instances)
    wrong = []
    for r in table["searches"]:
        earlier = starts.get(_key(r))
        for metric in ("eq4", "deadline"):
            start, _ = warm_start(earlier[metric] if earlier else None,
                                  EVALUATION_RUN["tolerance"])
            if f"{metric}_warm_start" not in r and start is not None and _bracketed(r, metric):
                continue  # at 76151fa a search the other's probes bracketed kept no start
            if r.get(f"{metric}_warm_start") != start:
                wrong.append(f"{_key(r)} {metric}: recorded {r.get(f'{metric}_warm_start')}, "
                             f"this input gives {start}")
    return wrong


def compare(table: dict, rerun: dict) -> dict[str, Any]:
    """Every search of ``rerun`` against the same search of ``table``."""
    old = {_key(r): r for r in table["searches"]}
    differ = [{"search": list(_key(r)), "table": _probes(old[_key(r)]), "rerun": _probes(r)}
              for r in rerun["searches"] if not _same(old[_key(r)], r)]
    tuning_differ = []
    tuning_rows = 0
    for name, by_regime in rerun.get("tuning", {}).items():
        for regime, t in by_regime.items():
            was = table["tuning"][name][regime]
            for setting, a, b in zip(t["settings"], was["results"], t["results"], strict=True):
                tuning_rows += 1
                if not _same(a, b):
                    tuning_differ.append({"contender": name, "regime": regime,
                                          "setting": setting, "table": _probes(a),
                                          "rerun": _probes(b)})
    return {"searches": len(rerun["searches"]), "identical": len(rerun["searches"]) - len(differ),
            "differ": differ, "tuning_searches": tuning_rows, "tuning_differ": tuning_differ}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    known = {t: (a, tuned) for t, a, tuned in TABLES}
    ap.add_argument("--table", required=True, choices=sorted(known))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    extra, tuned_from = known[args.table]
    rel = f"docs/data/{args.table}.json"
    table = json.loads((ROOT / rel).read_text())
    commit = one_commit(table["searches"])
    landed, warm = run_input(rel, commit)
    instances = int(extra[extra.index("--instances") + 1]) if "--instances" in extra else 2
    wrong = check_warm(table, warm, instances)
    if wrong:
        print(f"the run's input is not {landed[:7]}^:{rel}: {len(wrong)} warm starts differ, "
              f"e.g. {wrong[0]}", file=sys.stderr)
        return 2
    if tuned_from is None and earlier_tuning(warm) == {}:
        print(f"{landed[:7]}^:{rel} holds no tuning to start the tuning from", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        warm_path, out = Path(tmp) / "warm.json", Path(tmp) / "rerun.json"
        warm_path.write_text(json.dumps(warm))
        cmd = [sys.executable, str(ROOT / "bench" / "experiments" / "compare.py"), *extra,
               "--jobs", str(args.jobs), "--json", str(out), "--warm", str(warm_path)]
        if tuned_from is not None:
            cmd += ["--tuned", str(ROOT / "docs" / "data" / f"{tuned_from}.json")]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rerun = json.loads(out.read_text())
    found = compare(table, rerun)
    result = {
        "command": " ".join(["python", *sys.argv]), "table": args.table,
        "table_commit": commit, "checkout": code_commit(),
        "warm_from": f"{landed[:7]}^:{rel}",
        "cpu_seconds": round(after.ru_utime + after.ru_stime
                             - before.ru_utime - before.ru_stime),
        "wall_seconds": round(wall), **found}
    print(f"{args.table} at {result['checkout']} against its run at {commit}: "
          f"{found['identical']} of {found['searches']} searches identical, "
          f"{found['tuning_searches'] - len(found['tuning_differ'])} of "
          f"{found['tuning_searches']} tuning searches; {result['cpu_seconds']} CPU-s, "
          f"{result['wall_seconds']} s")
    for d in found["differ"][:5]:
        print("  differs:", d["search"], d["table"], "->", d["rerun"])
    if args.json:
        write_json(args.json, result)
    return 0 if not found["differ"] and not found["tuning_differ"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
