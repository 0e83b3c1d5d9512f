"""``hfx list``: policies, planners, workloads, profiles, shapes and presets."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    lst = sub.add_parser("list", help="list policies, planners, workloads and profiles")
    lst.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hfx.engine.planners import PLANNERS
    from hfx.policies import POLICIES
    from hfx.stepmodel.profiles import shipped_profiles
    from hfx.workloads.kinds import KINDS
    from hfx.workloads.tasks import WORKLOADS

    print("policies: ", ", ".join(POLICIES))
    print("planners: ", ", ".join(PLANNERS))
    print("workloads:", ", ".join(f"{w} ({', '.join(t.name for t in ts)})"
                                  for w, ts in WORKLOADS.items()),
          "; " + "; ".join(kind.describe() for kind in KINDS[1:]))
    print("profiles: ", ", ".join(shipped_profiles()))
    from hfx.model.shapes import SHAPES

    print("shapes:   ", ", ".join(SHAPES), "(random-weight models for hfx profile; or "
          "--checkpoint DIR)")
    from hfx.evaluation.presets import PRESETS

    print("presets:")
    for name, p in PRESETS.items():
        print(f"  {name:16s} {p.description}")
    return 0
