"""Engine runs (the decode cohort and decode runs) against stepping each sequence: CPU and wall
time per setting, same results checked.

For each setting, the run with engine runs on (the default: hfx/engine/cohort.py) and off
(``--no-engine-runs``), alternated, ``--repeat`` times each; the median CPU times (this
process's, which hold on a shared machine) and wall times, their ratios, and whether the two
result objects are identical (every field but the wall time and the switch itself). A setting
whose results differ fails the script. The budget-cut planners (chunked, vLLM's) keep a cohort
since 2026-12-01: off, they step each sequence as they all did before.

It also counts the steps taken in decode runs (several cohort steps as one loop timer when
nothing can change the plan between them, hfx/engine/decode_run.py), and their mean length.

    python bench/sim/engine_runs.py --json docs/data/engine_runs.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hfx import native
from hfx.config import SimConfig
from hfx.engine import EngineCore
from hfx.evaluation import write_json
from hfx.sim.driver import simulate

SETTINGS: dict[str, dict[str, Any]] = {
    "2 instances, rr at the knee (four-task, 90 QPS)":
        {"policy": "rr", "instances": 2, "qps": 90, "requests_per_task": 1500},
    "2 instances, hfx (four-task, 90 QPS)":
        {"policy": "hfx", "instances": 2, "qps": 90, "requests_per_task": 1500},
    "32 instances, rr at 45 QPS each":
        {"policy": "rr", "instances": 32, "qps": 1440, "requests_per_task": 6000},
    "32 instances, hfx at 45 QPS each":
        {"policy": "hfx", "instances": 32, "qps": 1440, "requests_per_task": 6000},
    "32 instances, polyserve at 45 QPS each":
        {"policy": "polyserve", "instances": 32, "qps": 1440, "requests_per_task": 6000},
    "128 instances, rr at 45 QPS each":
        {"policy": "rr", "instances": 128, "qps": 5760, "requests_per_task": 12000},
    "P/D 2+2, hfx (two-task, 120 QPS)":
        {"policy": "hfx", "workload": "two-task", "mode": "pd", "prefill": 2, "decode": 2,
         "qps": 120, "requests_per_task": 1500},
    "2 instances, rr below the knee (four-task, 40 QPS)":
        {"policy": "rr", "instances": 2, "qps": 40, "requests_per_task": 600},
    # The comparison's budget-cut engines (docs/results.md): vLLM's scheduler and chunked
    # prefill, where SGLang's router runs in the whole-systems tables.
    "2 instances, sglang on vLLM's engine (tiered-512-512, 55 QPS)":
        {"policy": "sglang", "planner": "vllm", "instances": 2, "workload": "tiered-512-512",
         "model": "llama-3.1-8b", "hardware": "h200", "max_num_seqs": 1024, "qps": 55,
         "duration": 150, "warmup": 20},
    "16 instances, sglang on vLLM's engine (four-task, 1,000 QPS)":
        {"policy": "sglang", "planner": "vllm", "instances": 16, "max_num_seqs": 1024,
         "qps": 1000, "duration": 150, "warmup": 20},
    "20 instances, sglang on chunked prefill (tiered-512-512, 520 QPS)":
        {"policy": "sglang", "planner": "chunked", "instances": 20,
         "workload": "tiered-512-512", "model": "llama-3.1-8b", "hardware": "h200",
         "max_num_seqs": 1024, "qps": 520, "duration": 60, "warmup": 10},
}


def comparable(result: dict) -> dict:
    out = dict(result)
    out.pop("wall_seconds")
    out["config"] = {k: v for k, v in out["config"].items() if k != "engine_runs"}
    return out


@contextmanager
def runs_taken() -> Iterator[Counter]:
    """Counts the decode runs the engines take, by length in steps (``EngineCore.end_run``,
    which the simulator's timer driver calls at each run's end). As Python only: compiled
    callers do not see a patched method."""
    lengths: Counter = Counter()
    end_run = EngineCore.end_run

    def counted_end_run(self: EngineCore, run):  # type: ignore[no-untyped-def]
        lengths[run.length] += 1
        return end_run(self, run)

    EngineCore.end_run = counted_end_run  # type: ignore[method-assign]
    try:
        yield lengths
    finally:
        EngineCore.end_run = end_run  # type: ignore[method-assign]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per setting and switch")
    ap.add_argument("--only", default=None, help="settings whose name contains this")
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()
    rows = []
    identical_everywhere = True
    for name, fields in SETTINGS.items():
        if args.only and args.only not in name:
            continue
        walls: dict[bool, list[float]] = {True: [], False: []}
        cpus: dict[bool, list[float]] = {True: [], False: []}
        results: dict[bool, dict] = {}
        for _ in range(args.repeat):
            for runs in (False, True):
                cpu = time.process_time()
                r = simulate(SimConfig(**fields, engine_runs=runs))
                cpus[runs].append(time.process_time() - cpu)
                walls[runs].append(r["wall_seconds"])
                results[runs] = r
        identical = comparable(results[True]) == comparable(results[False])
        identical_everywhere &= identical
        steps = results[True]["engine_steps"]
        in_runs: int | None = None
        if not native.active():
            with runs_taken() as lengths:
                simulate(SimConfig(**fields))
            in_runs = sum(k * v for k, v in lengths.items())
        row = {"setting": name, "config": fields, "identical": identical,
               "engine_steps": steps, "sim_seconds": results[True]["sim_seconds"],
               "cpu_s_stepping": statistics.median(cpus[False]),
               "cpu_s_engine_runs": statistics.median(cpus[True]),
               "wall_s_stepping": statistics.median(walls[False]),
               "wall_s_engine_runs": statistics.median(walls[True]),
               "steps_in_runs": in_runs,
               "run_share": in_runs / steps if steps and in_runs is not None else None,
               "mean_run": (in_runs / max(1, sum(lengths.values()))
                            if in_runs is not None else None)}
        row["speedup"] = row["wall_s_stepping"] / row["wall_s_engine_runs"]
        row["cpu_ratio"] = row["cpu_s_stepping"] / row["cpu_s_engine_runs"]
        row["sim_per_wall_engine_runs"] = row["sim_seconds"] / row["wall_s_engine_runs"]
        rows.append(row)
        print(f"{name}: CPU {row['cpu_s_stepping']:.2f} s stepping, "
              f"{row['cpu_s_engine_runs']:.2f} s engine runs ({row['cpu_ratio']:.2f}x); wall "
              f"{row['wall_s_stepping']:.2f} s stepping, "
              f"{row['wall_s_engine_runs']:.2f} s engine runs ({row['speedup']:.2f}x, "
              f"{row['sim_per_wall_engine_runs']:.0f}x real time); identical: {identical}; "
              + ("decode runs not counted (compiled)" if in_runs is None else
                 f"{row['run_share']:.1%} of steps in decode runs (mean {row['mean_run']:.1f})"),
              flush=True)
    write_json(args.json, {"command": "python bench/sim/engine_runs.py " + " ".join(sys.argv[1:]),
                           "compiled": native.active(), "repeat": args.repeat,
                           "settings": rows})
    return 0 if identical_everywhere else 1


if __name__ == "__main__":
    raise SystemExit(main())
