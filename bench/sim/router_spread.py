"""How a cache-aware router spreads a session workload over the fleet: requests per instance
after the warm-up, and attainment, per contender of bench/sim/prefix_routers.py, at one rate.
Writes JSON; not a test.

    python bench/sim/router_spread.py --workload agent-loops --instances 32 --qps 9.6 \\
        --contenders llm-d,llm-d@precise --json docs/data/prefix_cache/spread_agent_32.json
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

from hfx.evaluation import code_commit, write_json
from hfx.request import Outcome
from hfx.sim.clock import run
from hfx.sim.driver import load_requests, resolve_profile, run_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.sim.prefix_routers import config


def spread(name: str, args: argparse.Namespace) -> dict:
    cfg = config(name, args.workload, args.trace, args.instances, args.seed, args.duration,
                 args.warmup).model_copy(update={"qps": args.qps})
    control, _ = run(run_cluster(cfg, load_requests(cfg), resolve_profile(cfg)), virtual=True)
    records = [r for r in control.records.values() if r.request.arrival >= args.warmup]
    per = collections.Counter(r.instance for r in records if r.instance is not None)
    counts = sorted(per.values(), reverse=True)
    met = sum(r.outcome is Outcome.FINISHED and r.meets_slo() for r in records)
    return {"contender": name, "attainment": met / len(records), "requests": len(records),
            "instances_used": len(per), "per_instance": counts,
            "median_per_used_instance": statistics.median(counts) if counts else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="agent-loops")
    ap.add_argument("--trace", default="/tmp/sessions.jsonl", help="for --workload trace")
    ap.add_argument("--instances", type=int, default=32)
    ap.add_argument("--qps", type=float, required=True)
    ap.add_argument("--contenders", default="llm-d,llm-d@precise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--warmup", type=float, default=100.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [spread(name, args) for name in args.contenders.split(",")]
    for r in rows:
        print(f"{r['contender']:15s} attainment {r['attainment']:.3f}, "
              f"{r['instances_used']} of {args.instances} instances used, "
              f"most loaded {r['per_instance'][:5]}")
    if args.json:
        write_json(args.json, {"command": "python bench/sim/router_spread.py " + " ".join(
                                   sys.argv[1:]), "commit": code_commit(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
