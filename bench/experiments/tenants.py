"""Fair shares under a flood (issue 50), in the simulator: well-behaved tenants beside one that
sends ten times its share, with fair shares on and off.

Three calm tenants each send four-task requests (Poisson) at ``--calm-qps``; a fourth tenant,
``flood``, sends ``--flood-share`` times a fair share of the fleet's capacity (``--capacity``:
the fleet's four-task capacity at 90% attainment; a quarter of it is one tenant's share). Four
runs per seed, each a steady-state run (warm-up left out of every figure):

* ``calm``: the calm tenants alone (the reference);
* ``flood``: with the flood, fair shares off;
* ``flood+fair``: with the flood, fair shares on (``--fair-share``, hfx/cluster/fair_share.py);
* ``calm+fair``: the calm tenants alone, fair shares on (what they cost when nothing floods).

``--flood-tasks`` keeps only some of the flood's tasks (its other arrivals left out): with
fair shares off, a flood of only its cheapest tasks shows how much of the fleet the calm
tenants' whole demand leaves it, an upper bound on the goodput of any fair order.

Reported per run and tenant: SLO attainment (a request still pending at the end is a miss),
median TTFT, requests; the fleet's goodput (requests that met their SLO per second, and their
prompt and output tokens per second); Jain's
index over the tenants' attainment; the run's CPU seconds per request.

    python bench/experiments/tenants.py --json docs/data/tenants/flood.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.request import Outcome, Request
from hfx.sim.clock import run
from hfx.sim.driver import resolve_profile, run_cluster
from hfx.workloads.load import generate

CALM = ("alpha", "beta", "gamma")
SCENARIOS = ("calm", "flood", "flood+fair", "calm+fair")


def tenant_requests(tenant: str, qps: float, seed: int, duration: float) -> list[Request]:
    return [replace(r, id=f"{tenant}/{r.id}", tenant=tenant)
            for r in generate("four-task", qps, seed, duration=duration)]


def one(scenario: str, seed: int, args: argparse.Namespace) -> dict:
    flood = scenario.startswith("flood")
    requests: list[Request] = []
    for i, tenant in enumerate(CALM):
        requests += tenant_requests(tenant, args.calm_qps, 100 * seed + i, args.duration)
    if flood:
        rate = args.flood_share * args.capacity / (len(CALM) + 1)
        flood_reqs = tenant_requests("flood", rate, 100 * seed + 9, args.duration)
        if args.flood_tasks:  # the same arrivals, the other tasks' left out
            keep = set(args.flood_tasks.split(","))
            flood_reqs = [r for r in flood_reqs if r.task in keep]
        requests += flood_reqs
    requests.sort(key=lambda r: (r.arrival, r.id))
    config = SimConfig(workload="four-task", instances=args.instances, policy=args.policy,
                       max_num_seqs=1024, qps=len(requests) / args.duration, seed=seed,
                       duration=args.duration, warmup=args.warmup,
                       fair_share=args.scope if scenario.endswith("fair") else "off")
    profile = resolve_profile(config)
    t0 = time.process_time()
    control, _ = run(run_cluster(config, requests, profile), virtual=True)
    cpu = time.process_time() - t0
    per: dict[str, dict] = {}
    for tenant in ([*CALM, "flood"] if flood else CALM):
        records = [r for r in control.records.values()
                   if r.request.tenant == tenant and r.request.arrival >= args.warmup]
        met = [r for r in records if r.outcome is Outcome.FINISHED and r.meets_slo()]
        ttfts = [r.ttft for r in records if r.ttft is not None]
        per[tenant] = {"requests": len(records), "attainment": len(met) / len(records),
                       "median_ttft": statistics.median(ttfts) if ttfts else None,
                       "met_tokens": sum(r.request.prompt_len + r.num_tokens for r in met)}
    window = args.duration - args.warmup
    goodput = sum(p["attainment"] * p["requests"] for p in per.values()) / window
    goodput_tokens = sum(p["met_tokens"] for p in per.values()) / window
    att = [p["attainment"] for p in per.values()]
    jain = sum(att) ** 2 / (len(att) * sum(a * a for a in att)) if any(att) else 0.0
    return {"scenario": scenario, "seed": seed, "tenants": per, "goodput": goodput,
            "goodput_tokens": goodput_tokens,
            "jain_attainment": jain, "cpu_seconds": cpu,
            "cpu_us_per_request": cpu / len(requests) * 1e6, "requests": len(requests)}


def summary(runs: list[dict]) -> dict:
    """Means over seeds, and the goals' checks against the calm run."""
    out: dict[str, dict] = {}
    for scenario in SCENARIOS:
        rows = [r for r in runs if r["scenario"] == scenario]
        if not rows:
            continue
        calm = {t: {k: statistics.mean(r["tenants"][t][k] for r in rows)
                    for k in ("attainment", "median_ttft")} for t in CALM}
        out[scenario] = {"calm_tenants": calm,
                         "goodput": statistics.mean(r["goodput"] for r in rows),
                         "goodput_tokens": statistics.mean(r["goodput_tokens"] for r in rows),
                         "jain_attainment": statistics.mean(r["jain_attainment"] for r in rows),
                         "cpu_us_per_request": statistics.mean(r["cpu_us_per_request"]
                                                               for r in rows)}
    if {"calm", "flood+fair", "flood"} <= out.keys():
        ref, fair = out["calm"]["calm_tenants"], out["flood+fair"]["calm_tenants"]
        out["checks"] = {
            "attainment_drop_points": max(100 * (ref[t]["attainment"] - fair[t]["attainment"])
                                          for t in CALM),
            "median_ttft_ratio": max(fair[t]["median_ttft"] / ref[t]["median_ttft"]
                                     for t in CALM),
            "goodput_fair_over_unfair": out["flood+fair"]["goodput"] / out["flood"]["goodput"],
            "goodput_tokens_fair_over_unfair": (out["flood+fair"]["goodput_tokens"]
                                                / out["flood"]["goodput_tokens"])}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--policy", default="hfx")
    ap.add_argument("--capacity", type=float, default=187.5,
                    help="the fleet's four-task capacity, requests/s (issue 48's table: hfx, "
                    "2 instances, 1,024 sequences)")
    ap.add_argument("--calm-qps", type=float, default=30.0, help="each calm tenant's rate")
    ap.add_argument("--flood-share", type=float, default=10.0)
    ap.add_argument("--flood-tasks", default="",
                    help="comma-separated four-task tasks the flood keeps (default: all): a "
                    "flood of only the cheapest tasks bounds what any order of the calm "
                    "tenants' requests can leave the flood")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--scope", default="class", help="--fair-share scope: class or fleet")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tasks = [(s, seed) for seed in range(args.seeds) for s in args.scenarios.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(one, *zip(*tasks, strict=True), [args] * len(tasks)))
    for r in runs:
        print(f"{r['scenario']:>11} seed {r['seed']}: goodput {r['goodput']:.1f}/s "
              f"({r['goodput_tokens']:.0f} tokens/s), jain "
              f"{r['jain_attainment']:.3f}, " + ", ".join(
                  f"{t} {p['attainment']:.3f}/{(p['median_ttft'] or 0) * 1e3:.0f}ms"
                  for t, p in r["tenants"].items()))
    result = {"command": "python bench/experiments/tenants.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                  if k not in ("json", "jobs") and v != ""),
              "commit": subprocess.run(["git", "describe", "--always", "--dirty"],
                                       capture_output=True, text=True).stdout.strip(),
              "runs": runs, "summary": summary(runs)}
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
