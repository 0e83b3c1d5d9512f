"""``hfx whatif``: a trace replayed under every policy × fleet size."""

from __future__ import annotations

import argparse
from typing import Any

from hfx.cli.common import config_of, csv_list, write_json
from hfx.config import SimConfig, add_model_args


def add_parser(sub: Any) -> None:
    what = sub.add_parser("whatif", help="replay a trace under every policy × fleet size",
                          description="Replay a trace (hfx serve --record's, HFX's own columns, "
                          "or Azure, BurstGPT, Mooncake: --trace-format) on the simulator under "
                          "every policy and fleet size; print attainment and cost, and the "
                          "smallest fleet meeting --target per policy.")
    what.add_argument("--trace", required=True, help="the trace file")
    what.add_argument("--config", help="YAML file of options (flags override it)")
    what.add_argument("--policies", type=csv_list(str), default=["hfx", "rr"],
                      help="comma-separated policies (default: hfx,rr)")
    what.add_argument("--instances", type=csv_list(int), default=[1, 2, 3, 4],
                      help="comma-separated fleet sizes (default: 1,2,3,4)")
    what.add_argument("--target", type=float, default=0.9,
                      help="attainment a fleet must reach (default: 0.9)")
    what.add_argument("--jobs", type=int, default=None,
                      help="parallel processes (default: one per core)")
    what.add_argument("--ray-address", metavar="ADDR", default=None,
                      help="run on a Ray cluster: auto, ray://HOST:10001, or local")
    what.add_argument("--capacity", action="store_true",
                      help="also search each point's capacity: the highest rate of this trace "
                      "(its arrivals rescaled, as --trace-qps does) it carries at --target")
    what.add_argument("--json", metavar="PATH", help="write the result object here")
    what.add_argument("--plot", metavar="PNG", help="attainment and cost against fleet size")
    add_model_args(what, SimConfig, exclude=("policy", "instances", "workload", "qps"))
    what.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hfx.evaluation.whatif import plot, table, whatif

    config = config_of(SimConfig, args, args.config, workload=args.trace,
                     policy=args.policies[0], instances=args.instances[0])
    result = whatif(config, args.policies, args.instances, args.target, args.jobs,
                    args.ray_address, capacity=args.capacity)
    print(table(result))
    if args.json:
        write_json(args.json, result)
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
