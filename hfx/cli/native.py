"""``hfx native build | status``: the simulator's hot modules compiled by mypyc (hfx/native.py);
``HFX_NATIVE=1`` runs any command with them."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("native", help="compile the simulator's hot modules (opt in with "
                                      "HFX_NATIVE=1)")
    p.add_argument("action", choices=("build", "status"),
                   help="build: compile this source tree (mypyc, ~30 s; needs the dev extra "
                        "and a C compiler); status: whether a build matches it and this "
                        "process uses it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hfx import native

    if args.action == "build":
        try:
            where = native.build(log=False)
        except RuntimeError as e:  # no mypy, no compiler, a module mypyc refused
            print(f"hfx native: {e}", file=sys.stderr)
            return 2
        print(f"built {len(native.MODULES)} modules: {where}")
        print("run with HFX_NATIVE=1 to use them")
        return 0
    if native.mypyc_version() == "none":
        print("mypy is not installed in this interpreter: nothing can be built or matched "
              "(pip install -e '.[dev]')")
    else:
        found = native.built()
        print(f"source key {native.key()}: "
              + (f"built ({found})" if found is not None else "not built (hfx native build)"))
    print("this process: " + ("compiled" if native.active() else "Python"))
    return 0
