"""``hfx sweep``: a grid of policies (or a preset's series) × QPS, a table, JSON and a plot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hfx.cli.common import config_of, csv_list
from hfx.config import SimConfig, add_model_args, model_from_args


def add_parser(sub: Any) -> None:
    sweep = sub.add_parser("sweep", help="simulate a grid of policies × QPS",
                           description="Run every policy at every QPS (in parallel processes), "
                           "print a table, write JSON and a PNG like HyperFlexis Figure 3.")
    sweep.add_argument("--config", help="YAML file of options (flags override it)")
    sweep.add_argument("--preset", help="a named experiment (hfx list shows them); sets the "
                       "workload, the series and the QPS grid")
    sweep.add_argument("--policies", type=csv_list(str), default=["rr", "least-loaded"],
                       help="comma-separated policies (default: rr,least-loaded)")
    sweep.add_argument("--qps", type=csv_list(float), default=None,
                       help="comma-separated total QPS values (default: 20,40,...,160, or the "
                       "preset's)")
    sweep.add_argument("--out", default="results", help="output folder (default: results)")
    sweep.add_argument("--name", help="file name stem (default: sweep-<workload>)")
    sweep.add_argument("--jobs", type=int, default=None,
                       help="parallel processes (default: one per core)")
    sweep.add_argument("--ray-address", metavar="ADDR", default=None,
                       help="run the points on a Ray cluster instead of local processes: "
                       "auto, ray://HOST:10001, or local (start one here); hfx must be "
                       "installed on its nodes")
    sweep.add_argument("--seeds", type=int, default=1,
                       help="workload seeds per point, from --seed on; tables show the mean "
                       "and attainment's std (default: 1)")
    add_model_args(sweep, SimConfig, exclude=("policy", "qps"))
    sweep.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hfx.evaluation.presets import PRESETS
    from hfx.evaluation.sweep import capacity_table, ratio_table, run_grid, table, write

    preset = None
    if args.preset:
        try:
            preset = PRESETS[args.preset]
        except KeyError:
            raise ValueError(f"unknown preset {args.preset!r}; choose one of "
                             f"{', '.join(PRESETS)}") from None
    series = preset.series if preset else [(p, {"policy": p}) for p in args.policies]
    qps = args.qps or (list(preset.qps) if preset else [20, 40, 60, 80, 100, 120, 140, 160])
    fixed = {"workload": preset.workload, **preset.config} if preset else {}
    # The base carries the preset's fixed fields only: a series' fields must not leak into the
    # next series. Each series is validated before anything runs.
    base = config_of(SimConfig, args, args.config, **fixed, qps=qps[0])
    for _, fields in series:
        model_from_args(SimConfig, args, args.config, **{**fixed, **fields, "qps": qps[0]})
    results = run_grid(base, series, qps, jobs=args.jobs, seeds=args.seeds,
                       ray_address=args.ray_address)
    print(table(results))
    if preset and preset.ratios:
        print(ratio_table(results, preset.ratios))
    print(capacity_table(results))
    name = args.name or args.preset or f"sweep-{Path(base.workload).stem}"
    title = (preset.description if preset else
             f"{base.workload}, {base.instances} instances, {base.model} on {base.hardware}")
    json_path, png_path = write(results, args.out, name, title)
    print(f"wrote {json_path} and {png_path}")
    return 0
