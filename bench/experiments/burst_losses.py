"""Where a contender's misses fall on bursty-four-task: each task's attainment in the bursts
and between them, and the requests it placed as best effort, for variants of its policy
parameters at one rate. Writes JSON; not a test.

    python bench/experiments/burst_losses.py --qps 131 --seeds 0,1 \
        --variants "base;queue_order=arrival;tpot_guard=off;theta=0.7;best_effort=drained" \
        --json docs/data/burst_losses.json

Each run is one probe of the comparison (its evaluation run: 150 s after 20 s; the
contender's setting as ``--table`` tuned it, on that table's engine and regime), kept whole
with every request's record. A request is scored as the tables score it (Eq. 4's
``meets_slo``, per token ``meets_deadline_slo``) over the arrivals after the warm-up; it
arrived in a burst when its arrival falls in a cycle's 2.5x phase (hfx/workloads/tasks.py,
``BURSTY``). A variant is ``K=V,K=V`` over the table's setting (bench/experiments/hfx_params.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hfx.evaluation import code_commit, write_json
from hfx.evaluation.compare import CONTENDERS, EVALUATION_RUN
from hfx.sim.clock import run
from hfx.sim.driver import load_requests, resolve_profile, run_cluster
from hfx.workloads.tasks import BURSTY

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hfx_params import variant  # a sibling script, as reproduce.py imports its own

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = "bursty-four-task"


def in_burst(arrival: float) -> bool:
    """Whether ``arrival`` falls in a cycle's burst (the phase above the mean rate)."""
    _, cycle = BURSTY[WORKLOAD]
    t = arrival % sum(length for length, _ in cycle)
    for length, scale in cycle:
        if t < length:
            return scale > 1
        t -= length
    return False


def probe(name: str, setting: dict[str, Any], engine: str | None, qps: float, seed: int,
          params: dict[str, Any], seqs: int) -> dict[str, Any]:
    setting = {**setting, "policy_params": {**setting.get("policy_params", {}), **params}}
    config = CONTENDERS[name].config(
        setting, engine, qps=qps, duration=EVALUATION_RUN["duration"],
        warmup=EVALUATION_RUN["warmup"], workload=WORKLOAD, seed=seed, max_num_seqs=seqs)
    config = config.model_copy(update={"fold_records": False})  # every record, for its phase
    control, _ = run(run_cluster(config, load_requests(config), resolve_profile(config)),
                     virtual=True)
    counts: Counter[str] = Counter()
    for record in control.records.values():
        arrival = record.request.arrival
        if not config.warmup <= arrival < EVALUATION_RUN["duration"]:
            continue
        phase = "burst" if in_burst(arrival) else "quiet"
        for key in (f"{phase}:{record.request.task}", phase, "all"):
            counts[f"{key}:n"] += 1
            counts[f"{key}:eq4"] += record.meets_slo()
            counts[f"{key}:deadline"] += record.meets_deadline_slo()
            counts[f"{key}:best_effort"] += record.best_effort
    groups = sorted({k.rsplit(":", 1)[0] for k in counts})
    return {"seed": seed, "params": params, "max_num_seqs": seqs, "groups": {
        g: {"requests": counts[f"{g}:n"], "best_effort": counts[f"{g}:best_effort"],
            "eq4": counts[f"{g}:eq4"] / counts[f"{g}:n"],
            "deadline": counts[f"{g}:deadline"] / counts[f"{g}:n"]} for g in groups}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contender", default="hfx")
    ap.add_argument("--table", default="compare_engine/deadline_chunked_256",
                    help="the comparison JSON under docs/data whose setting and engine run")
    ap.add_argument("--qps", type=float, required=True)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--variants", default="base", help="';'-separated K=V,K=V (base: none)")
    ap.add_argument("--max-num-seqs", default=None,
                    help="','-separated sequence limits to run each variant at (default: the "
                         "table's regime, whose setting runs at each)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    table = json.loads((ROOT / "docs/data" / f"{args.table}.json").read_text())
    regime = table["protocol"]["regimes"][0]
    setting = table["tuning"][args.contender][str(regime)]["chosen"]
    engine = table["protocol"]["engine"]
    variants = [variant(v) for v in args.variants.split(";")]
    limits = [int(n) for n in args.max_num_seqs.split(",")] if args.max_num_seqs else [regime]
    calls = [(args.contender, setting, engine, args.qps, int(s), v, n)
             for n in limits for v in variants for s in args.seeds.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(probe, *zip(*calls, strict=True)))
    for r in rows:
        g = r["groups"]
        print(f"{r['max_num_seqs']} seqs, seed {r['seed']} {r['params']}: "
              f"all {g['all']['eq4']:.4f} / {g['all']['deadline']:.4f}, "
              f"burst {g['burst']['eq4']:.3f}, quiet {g['quiet']['eq4']:.3f}", file=sys.stderr)
    write_json(args.json, {
        "command": " ".join(["python", *sys.argv]), "commit": code_commit(),
        "date": datetime.date.today().isoformat(), "contender": args.contender,
        "table": args.table, "engine": engine, "regime": regime, "setting": setting,
        "qps": args.qps, "runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
