"""Memory of a long simulated run (issue 31): peak RSS and wall time of steady-state four-task
runs at 45 QPS per instance, each in a child process, with the finished records folded into
the metrics' columns as the run goes (``--fold-records``, the default) or kept. ``--tree``
runs the same configurations in another checkout (an earlier commit, side by side). Writes
JSON; not a test.

    python bench/sim/memory.py --instances 100 --duration 120 --json docs/data/sim_memory.json
    python bench/sim/memory.py --instances 1000 --duration 600 --modes fold \
        --json docs/data/sim_memory_1000.json
    python bench/sim/memory.py --instances 100 --duration 120,480 --modes fold,streaming \
        --json docs/data/sim_memory_streaming.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

PER_INSTANCE_QPS = 45.0  # bench/sim/sim_speed.py's load, past rr's knee
# Each mode's settings: records folded into columns (the default), kept, or folded into
# streaming aggregates (--metrics streaming).
MODES = {"fold": {"fold_records": True}, "keep": {"fold_records": False},
         "streaming": {"metrics": "streaming"}}


def one(config: dict) -> dict:
    """One run in this process: its result's size and this process's peak RSS."""
    from hfx import native
    from hfx.config import SimConfig
    from hfx.sim.driver import simulate

    mode = config.pop("mode", "fold")
    # An earlier checkout may not know a mode's settings: it runs as it is.
    settings = {k: v for k, v in MODES[mode].items() if k in SimConfig.model_fields}
    cfg = SimConfig(**config, **settings)
    t0 = time.perf_counter()
    r = simulate(cfg)
    wall = time.perf_counter() - t0
    return {"policy": cfg.policy, "instances": cfg.instances, "qps": cfg.qps,
            "duration": cfg.duration, "settings": settings, "requests": r["requests"],
            "finished": r["finished"], "attainment": r["attainment"],
            "attainment_dslo": r["attainment_dslo"], "sim_seconds": r["sim_seconds"],
            "wall_seconds": wall, "sim_per_wall": r["sim_seconds"] / wall,
            "compiled": native.active(),  # HFX_NATIVE=1 and a build of this tree (hfx native)
            # Linux reports KiB.
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(config: dict, tree: str) -> dict:
    """``one`` in a fresh process on the checkout ``tree`` (a directory holding ``hfx/``)."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one",
                           json.dumps(config), str(Path(tree).resolve())],
                          capture_output=True, text=True, check=True,
                          cwd="/")  # not the repository root: the tree on sys.path is used
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        sys.path.insert(0, sys.argv[3])
        print(json.dumps(one(json.loads(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=100)
    ap.add_argument("--duration", default="120",
                    help="simulated seconds of arrivals; several, comma-separated, to see growth")
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--policy", default="rr")
    ap.add_argument("--modes", default="fold,keep",
                    help="any of fold (the default), keep, streaming, comma-separated")
    ap.add_argument("--tree", default=None, help="also run in this checkout (side by side)")
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()

    from hfx.evaluation import write_json

    base = {"workload": "four-task", "policy": args.policy, "instances": args.instances,
            "qps": PER_INSTANCE_QPS * args.instances, "warmup": args.warmup}
    here = str(Path(__file__).resolve().parents[2])
    plan = [(here, mode) for mode in args.modes.split(",")]
    if args.tree:  # the same modes there (one it does not know runs as its default)
        plan += [(args.tree, mode) for mode in args.modes.split(",")]
    runs = []
    for (tree, mode), duration in itertools.product(plan, map(float, args.duration.split(","))):
        row = run_child({**base, "duration": duration, "mode": mode}, tree)
        row.update(mode=mode, tree="this" if tree == here else tree)
        runs.append(row)
        print(f"{mode:9s} {row['tree']:12s} {row['requests']:9d} requests "
              f"{row['wall_seconds']:8.1f} s wall ({row['sim_per_wall']:.2f}x real time), "
              f"peak RSS {row['peak_rss_mb']:8.0f} MB", flush=True)
        write_json(args.json, {"python": platform.python_version(),
                               "command": "python " + " ".join(sys.argv), "runs": runs})


if __name__ == "__main__":
    main()
