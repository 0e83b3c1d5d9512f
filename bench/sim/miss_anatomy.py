"""Where a policy loses requests at one rate: per task, how each scored request missed, and
whether the instances ran at their sequence limit. Writes JSON; not a test.

    python bench/sim/miss_anatomy.py --workload two-task --max-num-seqs 256 --planner vllm \\
        --policies hfx,scorpio --qps 98 --json docs/data/miss_anatomy/two_task_256.json
    python bench/sim/miss_anatomy.py --workload bursty-four-task --max-num-seqs 256 \\
        --planner vllm --policies hfx --qps 130 --period 40 --json ...

A scored request (arrived after the warm-up, within the run) ends in one of:

- ``attained``: its SLO met (Eq. 4; ``--metric deadline``: per token);
- ``queued_out``: its TTFT lost before it started: the policy rejected it, placed it best
  effort, or never placed it before the run's end (what a dispatcher that holds or sheds
  requests gives up);
- ``late_start``: placed as feasible, its first token late (queued in the engine, or
  predicted wrong);
- ``tpot``: its first token in time, its decode too slow;
- ``unfinished``: started, not finished by the run's end.

The instances' load comes from the Monitor's snapshots after the warm-up (every
``--monitor-interval`` seconds): the mean share of ``max_num_seqs`` running, and the share of
snapshots at the limit. With ``--period`` each task's outcomes are also counted by the phase
of its arrival in a cycle of that many seconds (bursty-four-task's 40: 30 s at half the rate,
then 10 s at 2.5x). The Monitor is patched to keep its snapshots, so this runs the Python
modules (without HFX_NATIVE).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

from hfx.cluster.monitor import Monitor
from hfx.config import SimConfig
from hfx.evaluation import code_commit, write_json
from hfx.request import Outcome, RequestRecord
from hfx.sim.clock import run
from hfx.sim.driver import load_requests, resolve_profile, run_cluster

OUTCOMES = ("attained", "queued_out", "late_start", "tpot", "unfinished")


def outcome(rec: RequestRecord, metric: str) -> str:
    met = rec.meets_slo() if metric == "eq4" else rec.meets_deadline_slo()
    if rec.outcome is Outcome.FINISHED and met:
        return "attained"
    ttft = rec.ttft
    target = rec.target
    assert target is not None  # task workloads name their SLOs
    if ttft is None:
        return "queued_out" if rec.dispatch_time is None or rec.best_effort else "unfinished"
    if ttft > target.ttft:
        return "queued_out" if rec.best_effort else "late_start"
    return "tpot" if rec.outcome is Outcome.FINISHED else "unfinished"


def anatomy(cfg: SimConfig, metric: str, period: float | None) -> dict:
    snapshots: list[tuple[float, int, int, int]] = []  # (time, instance, running, waiting)
    collect = Monitor.collect

    def keep(self: Monitor, instances):  # type: ignore[no-untyped-def]
        latest = collect(self, instances)
        for s in latest.values():
            snapshots.append((s.time, s.instance_id, s.num_running, s.num_waiting))
        return latest

    Monitor.collect = keep  # type: ignore[method-assign]
    try:
        control, _ = run(run_cluster(cfg, load_requests(cfg), resolve_profile(cfg)),
                         virtual=True)
    finally:
        Monitor.collect = collect  # type: ignore[method-assign]
    end = cfg.duration if cfg.duration is not None else float("inf")
    tasks: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    phases: dict[str, dict[int, collections.Counter[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(collections.Counter))
    for rec in control.records.values():
        r = rec.request
        if not cfg.warmup <= r.arrival < end:
            continue
        kind = outcome(rec, metric)
        tasks[r.task][kind] += 1
        if period:
            phases[r.task][int(r.arrival % period)][kind] += 1
    window = [s for s in snapshots if cfg.warmup <= s[0] < end]
    limit = cfg.max_num_seqs
    load = {
        "snapshots": len(window),
        "running_share": (sum(s[2] for s in window) / (limit * len(window))
                          if window else None),
        "at_limit_share": (sum(s[2] >= limit for s in window) / len(window)
                           if window else None),
        "mean_waiting_in_engine": (sum(s[3] for s in window) / len(window)
                                   if window else None),
    }
    total = sum(sum(c.values()) for c in tasks.values())
    attained = sum(c["attained"] for c in tasks.values())
    return {
        "policy": cfg.policy, "attainment": attained / total if total else None,
        "requests": total, "load": load,
        "tasks": {t: {k: c[k] for k in OUTCOMES} for t, c in sorted(tasks.items())},
        "phases": {t: {str(p): {k: c[k] for k in OUTCOMES} for p, c in sorted(by.items())}
                   for t, by in sorted(phases.items())} if period else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--policies", default="hfx")
    ap.add_argument("--planner", default="vllm")
    ap.add_argument("--qps", type=float, required=True)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--model", default=None)
    ap.add_argument("--hardware", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration", type=float, default=150.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--metric", choices=("eq4", "deadline"), default="eq4")
    ap.add_argument("--period", type=float, default=None,
                    help="count outcomes by arrival phase in cycles of this many seconds")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if os.environ.get("HFX_NATIVE"):
        ap.error("run without HFX_NATIVE: the compiled Monitor cannot be patched")
    fleet = {k: v for k, v in (("model", args.model), ("hardware", args.hardware)) if v}
    rows = []
    for policy in args.policies.split(","):
        cfg = SimConfig(workload=args.workload, policy=policy, planner=args.planner,
                        qps=args.qps, instances=args.instances, max_num_seqs=args.max_num_seqs,
                        seed=args.seed, duration=args.duration, warmup=args.warmup,
                        fold_records=False, **fleet)
        row = anatomy(cfg, args.metric, args.period)
        rows.append(row)
        load = row["load"]
        print(f"{policy}: attainment {row['attainment']:.3f}; sequences running "
              f"{load['running_share']:.0%} of the limit, at it in "
              f"{load['at_limit_share']:.0%} of snapshots")
        for task, c in row["tasks"].items():
            n = sum(c.values())
            print(f"  {task:18s} " + "  ".join(f"{k} {c[k] / n:.3f}" for k in OUTCOMES))
    if args.json:
        write_json(args.json, {"command": "python bench/sim/miss_anatomy.py " + " ".join(
                                   sys.argv[1:]), "commit": code_commit(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
