"""``hfx sim``: simulate one configuration and print a summary."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hfx.cli.common import config_of, write_json
from hfx.config import SimConfig, add_model_args


def add_parser(sub: Any) -> None:
    sim = sub.add_parser("sim", help="simulate one configuration",
                         description="Simulate one policy on one workload; print a summary.")
    sim.add_argument("--config", help="YAML file of options (flags override it)")
    sim.add_argument("--json", metavar="PATH", help="write the result object here")
    add_model_args(sim, SimConfig)
    sim.set_defaults(func=run)


def _summary(r: dict) -> str:
    def d(key: str) -> str:
        m = r[key]
        return "-" if m["mean"] is None else f"mean {m['mean']:.3f}  p50 {m['p50']:.3f}  " \
            f"p90 {m['p90']:.3f}  p99 {m['p99']:.3f}"
    lines = [
        f"policy {r['policy']}  workload {r['workload']}  qps {r['qps']:g}  instances "
        f"{r['instances']}  profile {r['profile']}",
        f"requests {r['requests']}  finished {r['finished']}  rejected {r['rejected']}  "
        f"shed {r['shed']}  failed {r['failed']}",
        f"attainment {r['attainment']:.3f}  (deadline-based {r['attainment_dslo']:.3f})  "
        f"goodput {r['goodput_rps']:.2f} req/s  cost {r['cost_units']} units",
        f"TTFT s  {d('ttft')}",
        f"TPOT s  {d('tpot')}",
        f"E2E s   {d('e2e')}",
        "per task: " + "  ".join(f"{t} {v['attainment']:.3f}" for t, v in r["per_task"].items()),
        f"simulated {r['sim_seconds']:.1f} s in {r['wall_seconds']:.2f} s wall "
        f"({r['sim_seconds'] / max(r['wall_seconds'], 1e-9):.0f}x)",
    ]
    return "\n".join(lines)


# A run of this many requests or more is long enough to say that it runs uncompiled.
LONG_RUN_REQUESTS = 100_000


def not_compiled_note(config: SimConfig) -> str | None:
    """One line for a long run that runs as Python, else None."""
    from hfx import native

    expected = config.qps * config.duration if config.duration is not None else 0.0
    if native.active() or expected < LONG_RUN_REQUESTS:
        return None
    return (f"hfx: about {expected:,.0f} requests, not compiled: `hfx native build` once per "
            "source tree, then HFX_NATIVE=1, runs the simulator 2.4-2.9x faster with the "
            "same results")


def run(args: argparse.Namespace) -> int:
    from hfx.sim.driver import simulate

    config = config_of(SimConfig, args, args.config)
    note = not_compiled_note(config)
    if note is not None:
        print(note, file=sys.stderr)
    result = simulate(config, progress=True)
    print(_summary(result))
    if args.json:
        write_json(args.json, result)
    return 0
