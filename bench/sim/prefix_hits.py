"""What the prefix cache is worth on prompts that repeat: hit rates and attainment per policy and
workload with ``--prefix-caching`` on and off, and capacity at 90% attainment on against off.
Writes JSON; not a test.

Workloads: the session kinds (``chat-sessions``, ``shared-prompts``, ``agent-loops``;
hfx/workloads/sessions.py) and a Mooncake-format session trace (512-token hash ids;
``bench/sim/make_session_trace.py``). Each runs at a given rate per instance (a trace: its
arrivals rescaled to that rate, ``--trace-qps``), steady state after a warm-up long enough for
a conversation's next turn to arrive (median 123 s apart).

    python bench/sim/make_session_trace.py --out /tmp/sessions.jsonl
    python bench/sim/prefix_hits.py --trace /tmp/sessions.jsonl --instances 8 \\
        --json docs/data/prefix_cache/hits_8.json
    python bench/sim/prefix_hits.py --trace /tmp/sessions.jsonl --instances 8 --capacity \\
        --policies hfx,least-loaded --seeds 2 --json docs/data/prefix_cache/capacity_8.json
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any

from hfx.config import SimConfig
from hfx.evaluation import code_commit, write_json
from hfx.evaluation.capacity import seed_capacity
from hfx.evaluation.runner import run_all
from hfx.sim.driver import simulate

POLICIES = ("hfx", "rr", "least-loaded", "scorpio", "aladdin", "sa", "slos-serve", "polyserve")
# Requests/s per instance where hfx attains ~0.9 with the cache on (scratch capacity runs on
# qwen2.5-7b@ascend-910b, 8 instances); the table runs here, the capacity search starts here.
RATES = {"chat-sessions": 8.0, "shared-prompts": 1.3, "agent-loops": 0.6, "trace": 1.2}
DURATION, WARMUP = 900.0, 300.0


def config(workload: str, trace: str, policy: str, instances: int, per_instance: float,
           caching: bool, seed: int = 0) -> SimConfig:
    rate = per_instance * instances
    fields: dict[str, Any] = {"policy": policy, "instances": instances, "seed": seed,
                              "prefix_caching": caching}
    if workload == "trace":
        # The trace as it is, rescaled: its own span is its duration; its first turns score.
        fields |= {"workload": trace, "trace_qps": rate, "slo_map": "default=2000:500"}
    else:
        fields |= {"workload": workload, "qps": rate, "duration": DURATION, "warmup": WARMUP}
    return SimConfig(**fields)


def _row(r: dict) -> dict:
    return {"attainment": r["attainment"], "attainment_dslo": r["attainment_dslo"],
            "hit_rate": r["hit_rate"], "requests": r["requests"],
            "ttft_mean": r["ttft"]["mean"], "ttft_p90": r["ttft"]["p90"],
            "tpot_mean": r["tpot"]["mean"], "backlog_at_end": r["backlog_at_end"],
            "per_instance_hit_rate": [c["hit_rate"] for c in r["per_instance_cache"].values()],
            "wall_seconds": r["wall_seconds"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="a Mooncake-format session trace")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workloads", default=",".join(RATES))
    ap.add_argument("--scale", type=float, default=1.0, help="rates times this")
    ap.add_argument("--off", default="all",
                    help="policies also run with caching off: all, or a comma list")
    ap.add_argument("--capacity", action="store_true",
                    help="capacity at 90%% attainment, on and off, instead of the table")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    policies, workloads = args.policies.split(","), args.workloads.split(",")
    off = set(policies) if args.off == "all" else set(args.off.split(",")) & set(policies)
    out: dict[str, Any] = {"command": "python bench/sim/prefix_hits.py " + " ".join(sys.argv[1:]),
                           "commit": code_commit(),
                           "python": platform.python_version(), "instances": args.instances,
                           "rates_per_instance": {w: RATES[w] * args.scale for w in workloads},
                           "duration": DURATION, "warmup": WARMUP}
    points = [(w, p, c) for w in workloads for p in policies for c in (True, False)
              if c or p in off]
    configs = [config(w, args.trace, p, args.instances, RATES[w] * args.scale, c)
               for w, p, c in points]
    if args.capacity:
        calls = [(cfg.model_copy(update={"seed": s}), 0.9, 0.05) for cfg in configs
                 for s in range(args.seeds)]
        found = run_all(seed_capacity, calls, args.jobs, desc="capacity")
        rows = []
        for i, (w, p, c) in enumerate(points):
            mine = found[i * args.seeds:(i + 1) * args.seeds]
            caps = [f["capacity"] for f in mine]
            rows.append({"workload": w, "policy": p, "prefix_caching": c, "capacity": caps,
                         "capacity_mean": sum(caps) / len(caps),
                         "hit_rate_at_capacity": [
                             max((q for q in f["probes"] if q["qps"] == f["capacity"]),
                                 key=lambda q: q["qps"], default={}).get("hit_rate")
                             for f in mine]})
        out["capacity"] = rows
        for w in workloads:
            for p in policies:
                on = next(r for r in rows if r["workload"] == w and r["policy"] == p
                          and r["prefix_caching"])
                no = next((r for r in rows if r["workload"] == w and r["policy"] == p
                           and not r["prefix_caching"]), None)
                gain = f"  x{on['capacity_mean'] / no['capacity_mean']:.2f}" \
                    if no and no["capacity_mean"] else ""
                print(f"{w:15s} {p:13s} capacity on {on['capacity_mean']:7.3g}"
                      + (f"  off {no['capacity_mean']:7.3g}" if no else "") + gain)
    else:
        results = run_all(simulate, [(c,) for c in configs], args.jobs, desc="prefix hits")
        out["rows"] = [{"workload": w, "policy": p, "prefix_caching": c, **_row(r)}
                       for (w, p, c), r in zip(points, results, strict=True)]
        for row in out["rows"]:
            print(f"{row['workload']:15s} {row['policy']:13s} "
                  f"{'on ' if row['prefix_caching'] else 'off'} hit {row['hit_rate']:.3f} "
                  f"attain {row['attainment']:.3f} dslo {row['attainment_dslo']:.3f} "
                  f"ttft {row['ttft_mean'] or 0:.3f}", flush=True)
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
