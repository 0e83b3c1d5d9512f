"""The decode cohort against stepping each sequence: wall time per setting, same results checked.

For each setting, the run with engine runs on (the default: hfx/engine/cohort.py) and off
(``--no-engine-runs``), alternated, ``--repeat`` times each; the median wall times, their ratio,
and whether the two result objects are identical (every field but the wall time and the switch
itself). A setting whose results differ fails the script.

It also counts how much a *multi-step* decode run could take (advancing several cohort steps as
one loop timer when nothing can change the plan between them): the steps that are pure cohort
decodes with no arrival, import, abort, first token or finish since the previous step, and that
follow such a step. That share bounds what multi-step runs could save.

    python bench/sim/engine_runs.py --json docs/data/engine_runs.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hfx.config import SimConfig
from hfx.engine import EngineCore
from hfx.evaluation import write_json
from hfx.sim import simulate

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
}


def comparable(result: dict) -> dict:
    out = dict(result)
    out.pop("wall_seconds")
    out["config"] = {k: v for k, v in out["config"].items() if k != "engine_runs"}
    return out


@contextmanager
def stretches() -> Iterator[Counter]:
    """Counts, per engine, the lengths of stretches of steps a multi-step run could take."""
    lengths: Counter = Counter()
    state: dict[int, list] = {}  # id(engine) → [current stretch, touched since last step]
    step, add, activate = EngineCore.step, EngineCore.add_request, EngineCore.activate_import

    def touch(engine: EngineCore) -> None:
        state.setdefault(id(engine), [0, False])[1] = True

    async def counted_step(self: EngineCore):  # type: ignore[no-untyped-def]
        out = await step(self)
        st = state.setdefault(id(self), [0, False])
        if out.ticked and not (out.request_ids or out.transitions or out.moves or st[1]):
            st[0] += 1
        else:
            if st[0]:
                lengths[st[0]] += 1
            st[0] = 0
        st[1] = False
        return out

    def counted_add(self: EngineCore, seq):  # type: ignore[no-untyped-def]
        touch(self)
        return add(self, seq)

    def counted_activate(self: EngineCore, rid, kv=None):  # type: ignore[no-untyped-def]
        touch(self)
        return activate(self, rid, kv)

    EngineCore.step = counted_step  # type: ignore[method-assign]
    EngineCore.add_request = counted_add  # type: ignore[method-assign]
    EngineCore.activate_import = counted_activate  # type: ignore[method-assign]
    try:
        yield lengths
    finally:
        EngineCore.step, EngineCore.add_request = step, add  # type: ignore[method-assign]
        EngineCore.activate_import = activate  # type: ignore[method-assign]


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
        results: dict[bool, dict] = {}
        for _ in range(args.repeat):
            for runs in (False, True):
                r = simulate(SimConfig(**fields, engine_runs=runs))
                walls[runs].append(r["wall_seconds"])
                results[runs] = r
        identical = comparable(results[True]) == comparable(results[False])
        identical_everywhere &= identical
        with stretches() as lengths:
            simulate(SimConfig(**fields))
        steps = results[True]["engine_steps"]
        runnable = sum(k * v for k, v in lengths.items() if k >= 2)
        row = {"setting": name, "config": fields, "identical": identical,
               "engine_steps": steps, "sim_seconds": results[True]["sim_seconds"],
               "wall_s_stepping": statistics.median(walls[False]),
               "wall_s_cohort": statistics.median(walls[True]),
               "steps_in_multi_step_stretches": runnable,
               "multi_step_share": runnable / steps if steps else 0.0,
               "mean_stretch": (sum(k * v for k, v in lengths.items())
                                / max(1, sum(lengths.values())))}
        row["speedup"] = row["wall_s_stepping"] / row["wall_s_cohort"]
        row["sim_per_wall_cohort"] = row["sim_seconds"] / row["wall_s_cohort"]
        rows.append(row)
        print(f"{name}: {row['wall_s_stepping']:.2f} s stepping, {row['wall_s_cohort']:.2f} s "
              f"cohort ({row['speedup']:.2f}x, {row['sim_per_wall_cohort']:.0f}x real time); "
              f"identical: {identical}; {row['multi_step_share']:.1%} of steps in stretches a "
              f"multi-step run could take", flush=True)
    write_json(args.json, {"command": "python bench/sim/engine_runs.py " + " ".join(sys.argv[1:]),
                           "repeat": args.repeat, "settings": rows})
    return 0 if identical_everywhere else 1


if __name__ == "__main__":
    raise SystemExit(main())
