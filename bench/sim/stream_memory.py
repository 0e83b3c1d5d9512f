"""Memory and time of a task set's request stream alone (issue 31): build the four-task stream
of ``--instances`` × 45 QPS for ``--duration`` seconds and read every row of it, in order, each
checkout in a fresh process; peak RSS and the sum of its prompt lengths (the same rows). Writes
JSON; not a test.

    python bench/sim/stream_memory.py --tree /tmp/before --tree . --instances 1000 \
        --duration 600 --json docs/data/stream_memory_1000.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

PER_INSTANCE_QPS = 45.0  # bench/sim/memory.py's load


def one(instances: int, duration: float) -> dict:
    """Build and read the stream in this process."""
    from hfx.workloads.load import stream

    t0 = time.perf_counter()
    s = stream("four-task", PER_INSTANCE_QPS * instances, 0, duration=duration)
    built = time.perf_counter() - t0
    rows, prompt_tokens = s.rows, 0
    for lo in range(0, len(s), rows.block):
        if hasattr(rows, "source"):  # drawn a chunk at a time
            block = rows.source(lo, lo + rows.block)
        else:  # held whole (before): the same slice StreamRows takes
            block = tuple(c[lo:lo + rows.block] for c in rows.columns)
        prompt_tokens += int(block[3].sum())
    return {"instances": instances, "duration": duration, "requests": len(s),
            "prompt_tokens": prompt_tokens, "build_seconds": built,
            "build_and_read_seconds": time.perf_counter() - t0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True,
                    help="a checkout holding hfx/ (repeat: each in its own process)")
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--json", required=True, metavar="PATH")
    args = ap.parse_args()
    runs = []
    for tree in args.tree:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one",
                               str(Path(tree).resolve()), str(args.instances), str(args.duration)],
                              capture_output=True, text=True, check=True, cwd="/")
        runs.append({"tree": tree, **json.loads(done.stdout.strip().splitlines()[-1])})
        print(json.dumps(runs[-1]))
    Path(args.json).write_text(json.dumps({
        "command": " ".join(sys.argv), "python": platform.python_version(), "runs": runs},
        indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--one":
        sys.path.insert(0, sys.argv[2])
        print(json.dumps(one(int(sys.argv[3]), float(sys.argv[4]))))
    else:
        main()
