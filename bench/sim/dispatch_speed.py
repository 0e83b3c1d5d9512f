"""Dispatch decisions per second of each policy, and the time of one SA search.
Writes JSON; not a test.

Setup: 64 instances (Qwen2.5-7B on 910B profile), a queue held at 10,000 four-task requests:
every dispatched request is finished at once (freeing its instance) and replaced by a new
arrival, so the measurement isolates the policy's decision path. The clock advances 1 ms per
call, or to the policy's requested wake-up.

    python bench/sim/dispatch_speed.py --json docs/data/dispatch_speed.json
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from array import array
from dataclasses import replace

from hfx.engine import Role
from hfx.engine.stats import InstanceStats
from hfx.evaluation import write_json
from hfx.policies import POLICIES, ClusterView, InstanceView, make_policy
from hfx.policies.sa_search import Job, anneal, evaluate
from hfx.request import Outcome, RequestRecord
from hfx.stepmodel.latency import load_profile
from hfx.workloads.load import generate

PROFILE = load_profile("qwen2.5-7b@ascend-910b")


def make_view(n: int) -> ClusterView:
    blocks = PROFILE.num_kv_blocks
    views = [InstanceView(i, Role.COLOCATED,
                          InstanceStats(i, Role.COLOCATED, 0.0, 0, 0, 0, 0, 0, blocks, 16, 0, 256,
                                        0.0, 0)) for i in range(n)]
    return ClusterView(0.0, views, PROFILE.model, PROFILE)


def bench_policy(name: str, instances: int, depth: int, decisions: int,
                 max_wall: float) -> dict:
    params = {"t0": 100.0, "iterations": 20} if name == "sa" else {}
    policy = make_policy(name, **params)
    view = make_view(instances)
    base = generate("four-task", qps=1000.0, seed=0, requests_per_task=3000)
    fresh = (replace(r, id=f"{r.id}#{k}") for k in itertools.count() for r in base)
    for _ in range(depth):
        policy.enqueue(next(fresh), 0.0)
    now, done, calls = 0.0, 0, 0
    t0 = time.perf_counter()
    while done < decisions and time.perf_counter() - t0 < max_wall:
        view.now = now
        d = policy.schedule(view)
        calls += 1
        for x in d.dispatch:
            rec = RequestRecord(x.request, dispatch_time=now, instance=x.instance,
                                token_times=array("d", [now]), finish_time=now,
                                outcome=Outcome.FINISHED)
            policy.on_finished(rec, view)
            policy.enqueue(replace(next(fresh), arrival=now), now)
        for _ in d.reject:
            policy.enqueue(replace(next(fresh), arrival=now), now)
        done += len(d.dispatch) + len(d.reject)
        now = max(now + 1e-3, d.wake_at or 0.0)
    wall = time.perf_counter() - t0
    return {"decisions": done, "schedule_calls": calls, "wall_seconds": wall,
            "decisions_per_second": done / wall, "params": params}


def bench_sa(n: int, repeat: int) -> dict:
    """One full annealing run: the jobs are tight enough (long prompts, TTFT 0.7 s, some already
    waited) that no ordering meets every SLO, so the early exit of SA §4.3 never fires."""
    rng = random.Random(n)
    jobs = [Job(rng.randint(300, 1500), rng.randint(10, 100), rng.random() * 0.4, 0.7,
                rng.choice([0.5, 0.7, 1.0])) for _ in range(n)]
    times = []
    for k in range(repeat):
        t0 = time.perf_counter()
        plan = anneal(jobs, PROFILE.model, 16, k)
        times.append(time.perf_counter() - t0)
    _, met = evaluate(jobs, plan.order, plan.sizes, PROFILE.model)
    assert met < n, "the benchmark must time a full search, not the early exit"
    return {"requests": n, "median_ms": statistics.median(times) * 1e3,
            "min_ms": min(times) * 1e3, "slos_met_by_best_plan": met,
            "evaluations": 63 * 100,
            "hyperparameters": "T0=500, T_min=20, K=100, alpha=0.95"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--depth", type=int, default=10_000)
    ap.add_argument("--decisions", type=int, default=20_000)
    ap.add_argument("--max-wall", type=float, default=20.0, help="seconds per policy at most")
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()
    out: dict = {"setup": vars(args) | {"json": None}, "policies": {}, "sa_search": []}
    for name in POLICIES:
        r = bench_policy(name, args.instances, args.depth, args.decisions, args.max_wall)
        out["policies"][name] = r
        print(f"{name:14s} {r['decisions_per_second']:>10,.0f} decisions/s "
              f"({r['decisions']} in {r['wall_seconds']:.2f} s)")
    for n in (10, 40):
        r = bench_sa(n, repeat=5)
        out["sa_search"].append(r)
        print(f"SA search, {n} requests: {r['median_ms']:.1f} ms (median of 5)")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
