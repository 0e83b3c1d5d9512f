"""``hfx capacity``: the highest sustained QPS at a target attainment, per seed."""

from __future__ import annotations

import argparse
from typing import Any

from hfx.cli.common import config_of, write_json
from hfx.config import SimConfig, add_model_args


def add_parser(sub: Any) -> None:
    cap = sub.add_parser("capacity", help="the highest sustained QPS at a target attainment",
                         description="Bisect over steady-state runs (--duration, default 300 s "
                         "after a 60 s --warmup) for the highest QPS whose attainment meets "
                         "--target, per seed; print each seed's and the mean ± std, and the "
                         "fleet's work bound. --qps is where the search starts.")
    cap.add_argument("--config", help="YAML file of options (flags override it)")
    cap.add_argument("--json", metavar="PATH", help="write the result here")
    cap.add_argument("--target", type=float, default=0.9,
                     help="attainment the rate must keep (default: 0.9)")
    cap.add_argument("--seeds", type=int, default=3, help="workload seeds, from --seed on "
                     "(default: 3)")
    cap.add_argument("--tolerance", type=float, default=0.02,
                     help="stop when the bracket is this close, relative (default: 0.02)")
    cap.add_argument("--jobs", type=int, default=None,
                     help="parallel processes (default: one per core, at most one per seed)")
    cap.add_argument("--ray-address", metavar="ADDR", default=None,
                     help="run the seeds on a Ray cluster instead of local processes: auto, "
                     "ray://HOST:10001, or local (start one here)")
    add_model_args(cap, SimConfig)
    cap.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hfx.evaluation.capacity import capacity

    config = config_of(SimConfig, args, args.config)
    result = capacity(config, args.seeds, args.target, args.tolerance, args.jobs,
                      args.ray_address)
    for s in result["seeds"]:
        # A run ended once it could not meet the target reads "<" its target: it failed.
        probes = "  ".join(f"{p['qps']:.4g}:" + (f"<{args.target:g}" if "stopped_at" in p
                                                  else f"{p['attainment']:.3f}")
                           for p in s["probes"])
        print(f"seed {s['seed']}: {s['capacity']:.4g} QPS   (qps:attainment  {probes})")
    print(f"{result['policy']} on {result['workload']}, {result['instances']} instances: "
          f"capacity at {result['target']:.0%} attainment {result['capacity_mean']:.4g} ± "
          f"{result['capacity_std']:.2g} QPS ({result['per_instance_mean']:.4g} per instance; "
          f"{len(result['seeds'])} seeds, {result['duration']:g} s steady state after "
          f"{result['warmup']:g} s warm-up)")
    bound = result["work_bound"]
    if bound is not None:
        print(f"work bound {bound['qps']:.4g} QPS (the most any policy could carry here, "
              f"counting work only: hfx/evaluation/bound.py); this capacity is "
              f"{result['capacity_mean'] / bound['qps']:.0%} of it")
        blind = result["blind_bound"]
        if blind is not None:
            print(f"blind bound {blind['qps']:.4g} QPS (the same, knowing no output length "
                  f"before it ends); this capacity is "
                  f"{result['capacity_mean'] / blind['qps']:.0%} of it")
    if args.json:
        write_json(args.json, result)
    return 0
