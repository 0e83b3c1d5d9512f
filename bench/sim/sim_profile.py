"""Where a simulation's time goes: one run under cProfile, its own time per function
summed by part of the system.

- ``engine per token``: the engine core's advance, the planners, the block manager (their
  loops visit every running sequence each step);
- ``ledger per token``: each token's time appended to its request's record;
- ``asyncio loop``: the event loop, timers, futures and tasks that step each instance on the
  virtual clock;
- ``engine per step``, ``control plane``, ``policy``, ``workload and metrics``, ``other``.

A builtin's time (``list.append``, ``len``) goes to the part that called it. cProfile charges
a fixed cost per call, so parts made of many small calls (the loop, the
control plane) read larger than they run, and inlined loops (per token) smaller; read the
shares as an order of magnitude, with the unprofiled wall time beside them.

    python bench/sim/sim_profile.py --json docs/data/sim_profile.json
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import Counter

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.sim.driver import simulate

PER_TOKEN_ENGINE = {("core.py", "_advance"), ("core.py", "_retire"),
                    ("block_manager.py", "allocate"), ("block_manager.py", "free")}


def part(path: str, name: str) -> str:
    file = path.rsplit("/", 1)[-1]
    if "/planners/" in path or (file, name) in PER_TOKEN_ENGINE:
        return "engine per token"
    if file == "ledger.py" and name == "on_tokens":
        return "ledger per token"
    if "asyncio" in path or file == "clock.py":
        return "asyncio loop"
    if "/hfx/engine/" in path:
        return "engine per step"
    if "/hfx/cluster/" in path:
        return "control plane"
    if "/hfx/policies/" in path:
        return "policy"
    if "/hfx/evaluation/" in path or file in ("request.py", "sim.py"):
        return "workload and metrics"
    return "other"


def run(config: SimConfig) -> dict:
    start = time.perf_counter()
    plain = simulate(config)
    wall = time.perf_counter() - start
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(config)
    profiler.disable()
    shares: Counter[str] = Counter()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (path, _, name), (_, _, own, _, callers) in stats.items():
        if path == "~":  # a builtin (list.append, len, ...): charged to whoever called it
            for (c_path, _, c_name), c in callers.items():
                shares[part(c_path, c_name)] += c[2]
        else:
            shares[part(path, name)] += own
    total = sum(shares.values())
    tokens = plain["output_tokens_per_s"] * plain["sim_seconds"]
    return {"policy": config.policy, "instances": config.instances,
            "requests": plain["requests"], "wall_s": wall, "engine_steps": plain["engine_steps"],
            "tokens": round(tokens), "us_per_step": wall / plain["engine_steps"] * 1e6,
            "us_per_token": wall / tokens * 1e6,
            "shares": {k: v / total for k, v in shares.most_common()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="rr:2:6000,rr:32:24000,hfx:32:24000",
                    help="policy:instances:requests, comma-separated (four-task, 45 QPS each)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = {"command": "python bench/sim/sim_profile.py " + " ".join(sys.argv[1:]), "runs": []}
    for case in args.cases.split(","):
        policy, instances, requests = case.split(":")
        n = int(instances)
        config = SimConfig(workload="four-task", policy=policy, instances=n, qps=45.0 * n,
                           requests_per_task=int(requests) // 4)
        r = run(config)
        out["runs"].append(r)
        print(f"{policy} on {n}: {r['wall_s']:.1f} s, {r['us_per_step']:.0f} us/step, "
              f"{r['us_per_token']:.2f} us/token; "
              + ", ".join(f"{k} {v:.0%}" for k, v in r["shares"].items()), flush=True)
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
