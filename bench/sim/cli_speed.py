"""CLI start-up time: wall seconds of ``hfx list`` and ``hfx sim --help``, each the
median of --repeat fresh processes. Writes JSON; not a test. Target: under 0.5 s each.

    python bench/sim/cli_speed.py --json docs/data/cli_speed.json
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

from hfx.evaluation import write_json

COMMANDS = {"hfx list": ["list"], "hfx sim --help": ["sim", "--help"],
            "python -c pass": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()
    out: dict = {"python": platform.python_version(), "machine": platform.machine(),
                 "target_seconds": 0.5, "commands": {}}
    for name, argv in COMMANDS.items():
        cmd = [sys.executable, "-c", "pass"] if argv is None else [
            sys.executable, "-c", "import sys; from hfx.cli import main; sys.exit(main())", *argv]
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
        out["commands"][name] = {"median_s": statistics.median(times), "min_s": min(times),
                                 "max_s": max(times)}
        print(f"{name:16s} median {statistics.median(times):.3f} s (min {min(times):.3f})")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
