"""What issue 18's speed targets leave per engine step, against what a step costs.

For each target, its run (four-task, 45 QPS per instance, rr; the 128-instance target names no
size, 48k requests here; the 1,000-instance one's 27 M requests are cut to 450k, 10 s of
arrivals) gives the engine steps and the tokens per step; the target's wall time
divided by the steps is the budget of one step, all in (engine, control plane, policy, loop).
Beside it:

- ``now``: the wall time per step of that run as the simulator stands;
- ``engine alone``: one ``EngineCore`` with a ``SimExecutor`` stepping a batch of decodes of the
  run's size, driven as the simulator drives it (a loop timer per step), every step planned,
  nothing else: no control plane, no policy, no records. The cheapest step this engine core
  takes;
- ``empty timer``: the virtual loop's cost of one event with nothing done in it;
- ``floor``: engine alone plus an empty timer for each arrival (issue 31: "an empty timer per
  step on the virtual loop; the cheapest plan"). A target whose budget is below it is beyond
  what this loop and engine core can do; above it, the distance is the rest of the simulator.

    python bench/sim/sim_budget.py --json docs/data/sim_budget.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from hfx.backends.local import LocalInstance
from hfx.config import SimConfig
from hfx.engine import EngineConfig, EngineCore, SimExecutor, StepOutput
from hfx.engine.sequence import Sequence
from hfx.evaluation import write_json
from hfx.sim.clock import VirtualTimeLoop
from hfx.sim.driver import resolve_profile, simulate
from hfx.stepmodel.latency import Profile


# The target, its run, and the wall time the target allows that run.
def targets() -> list[dict]:
    return [
        {"target": "300,000 requests on 32 instances in <= 20 s", "instances": 32,
         "run_requests": 300_000, "wall_for": lambda r: 20.0},
        {"target": "128 instances >= 10x real time", "instances": 128, "run_requests": 48_000,
         "wall_for": lambda r: r["sim_seconds"] / 10},
        {"target": "2 instances >= 1,000x real time", "instances": 2, "run_requests": 1_200,
         "wall_for": lambda r: r["sim_seconds"] / 1_000},
        # The target's run is 27 M requests (10 simulated minutes); this is its first 10 s of
        # arrivals and their drain, long enough that the drain is not most of the run.
        {"target": "1,000 instances >= 2x real time", "instances": 1_000,
         "run_requests": 450_000, "wall_for": lambda r: r["sim_seconds"] / 2},
    ]


class _Planned(SimExecutor):
    # Every step planned (no decode runs): the cheapest step a run at the knee takes, where an
    # arrival lands in most steps and cuts runs short.
    advances_runs = False


def engine_alone(profile: Profile, batch: int, steps: int) -> float:
    """Wall microseconds per step of one engine decoding ``batch`` sequences, driven as the
    simulator drives it (LocalInstance's timer driver: one loop timer per step, the engine
    core's begin and end of a step, the planner, the cohort's advance), every step planned.
    Nothing else runs: no control plane, policy or records."""
    warm = 20  # steps to prefill the batch and settle
    engine = EngineCore(EngineConfig(num_kv_blocks=profile.num_kv_blocks,
                                     block_size=profile.block_size), _Planned(profile.model))
    for i in range(batch):
        engine.add_request(Sequence(f"r{i}", prompt_len=512, max_tokens=warm + steps + 10))
    instance = LocalInstance(0, engine)
    marks: list[float] = []

    def sink(_: int, out: StepOutput) -> None:  # at the steps that start and end the timing
        if engine.num_steps in (warm, warm + steps):
            marks.append(time.perf_counter())
            if len(marks) == 2:
                asyncio.get_running_loop().stop()

    loop = VirtualTimeLoop()
    try:
        loop.call_soon(instance.start, sink)
        loop.run_forever()
        return (marks[1] - marks[0]) / steps * 1e6
    finally:
        loop.close()


def empty_timer(chains: int, callbacks: int) -> float:
    """Wall microseconds per callback of ``chains`` loop timers, each setting the next at its
    own period (the pattern of instances stepping): the virtual loop's cost of one event with
    nothing done in it."""
    loop = VirtualTimeLoop()
    left = [callbacks]

    def tick(period: float) -> None:
        left[0] -= 1
        if left[0] <= 0:
            loop.stop()
            return
        loop.call_at(loop.time() + period, tick, period)

    for k in range(chains):
        loop.call_at(0.0, tick, 0.02 + 0.0001 * k)
    try:
        t0 = time.perf_counter()
        loop.run_forever()
        return (time.perf_counter() - t0) / callbacks * 1e6
    finally:
        loop.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per target (median taken)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict = {"command": "python bench/sim/sim_budget.py " + " ".join(sys.argv[1:]),
                 "targets": []}
    for t in targets():
        n = t["instances"]
        config = SimConfig(workload="four-task", policy="rr", instances=n, qps=45.0 * n,
                           requests_per_task=t["run_requests"] // 4)
        profile = resolve_profile(config)
        runs = [simulate(config) for _ in range(args.repeat)]
        r = runs[0]  # deterministic: the same steps and tokens every run
        wall = statistics.median(x["wall_seconds"] for x in runs)
        steps = r["engine_steps"]
        tokens = r["output_tokens_per_s"] * r["sim_seconds"]
        per_step = tokens / steps
        budget = t["wall_for"](r) / steps * 1e6
        alone = statistics.median(engine_alone(profile, round(per_step), 400)
                                  for _ in range(args.repeat))
        timer = statistics.median(empty_timer(n, 200_000) for _ in range(args.repeat))
        # The floor: each step's own timer and plan, each arrival's timer.
        floor = alone + timer * r["requests"] / steps
        row = {"target": t["target"], "instances": n, "requests": r["requests"],
               "profile": profile.name,
               "sim_seconds": r["sim_seconds"], "engine_steps": steps,
               "tokens_per_step": per_step, "wall_s": wall,
               "us_per_step_now": wall / steps * 1e6,
               "us_per_step_budget": budget,
               "us_per_step_engine_alone": alone,
               "us_per_empty_timer": timer,
               "us_per_step_floor": floor,
               "speedup_needed": wall / steps * 1e6 / budget,
               "floor_over_budget": floor / budget,
               "now_over_floor": wall / steps * 1e6 / floor}
        out["targets"].append(row)
        print(f"{t['target']}: budget {budget:.0f} us/step, now {row['us_per_step_now']:.0f}, "
              f"engine alone {alone:.1f} ({per_step:.0f} tokens/step), empty timer "
              f"{timer:.2f}, floor {floor:.1f}; needs {row['speedup_needed']:.1f}x, "
              f"{row['now_over_floor']:.1f}x above the floor", flush=True)
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
