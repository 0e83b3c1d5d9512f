"""How far the same served requests move on this machine, from the requests
``bench/real_vllm/live_calibration.py`` kept: every run served the same trace, so window k of
every run holds the same requests at the same rate. Each window's decode scale is fitted on its own
(``hfx.evaluation.calibration.fit_served``); if the
scale were a property of the load (the machine-wide
token rate, the batch), the same window would get the same scale in every run, and it would
follow the window's token rate.

    python bench/real_vllm/calibration_spread.py docs/results/vllm-live-calibration.json \
        --json docs/results/vllm-calibration-spread.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from hfx.evaluation import write_json
from hfx.evaluation.calibration import Served, fit_served
from hfx.request import SLO
from hfx.stepmodel.latency import StepTimeModel

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.real_vllm.live_calibration import ENGINE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", help="bench/real_vllm/live_calibration.py's JSON (its "
                    ".served.jsonl beside)")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    result = json.loads(Path(args.result).read_text())
    base = StepTimeModel(**result["profile"]["model"])
    rows = [json.loads(line) for line in
            Path(args.result).with_suffix(".served.jsonl").read_text().splitlines()]
    windows: list[dict] = []
    for (trial, mode), group in itertools.groupby(rows, key=lambda r: (r["trial"], r["mode"])):
        data = sorted((Served(r["instance"], r["dispatched"], r["prompt_len"], r["output_len"],
                              r["ttft"], r["tpot"], SLO(**r["slo"])) for r in group),
                      key=lambda s: s.dispatched)
        n = len(data) // args.windows
        for k in range(args.windows):
            part = data[k * n:(k + 1) * n]
            fit = fit_served(base, part, ENGINE)
            seconds = part[-1].dispatched - part[0].dispatched
            windows.append({"trial": trial, "mode": mode, "window": k, "requests": len(part),
                            "tokens_per_s": sum(s.output_len for s in part) / seconds,
                            "mean_tpot": statistics.mean(s.tpot for s in part),
                            "decode_scale": fit.decode_scale, "delivery": fit.delivery})
    per_window = {}
    for k in range(args.windows):
        scales = [w["decode_scale"] for w in windows if w["window"] == k]
        per_window[k] = {"min": min(scales), "max": max(scales),
                         "max_over_min": max(scales) / min(scales)}
    rate = np.array([w["tokens_per_s"] for w in windows])
    out = {"command": "python bench/real_vllm/calibration_spread.py " + " ".join(sys.argv[1:]),
           "windows": windows, "scale_by_window": per_window,
           "corr_tokens_per_s_scale": float(np.corrcoef(rate, [w["decode_scale"]
                                                               for w in windows])[0, 1]),
           "corr_tokens_per_s_tpot": float(np.corrcoef(rate, [w["mean_tpot"]
                                                              for w in windows])[0, 1])}
    for k, s in per_window.items():
        print(f"window {k}: decode scale {s['min']:.2f}-{s['max']:.2f} over "
              f"{len(windows) // args.windows} runs")
    print(f"correlation of a window's token rate with its scale "
          f"{out['corr_tokens_per_s_scale']:.2f}, with its mean TPOT "
          f"{out['corr_tokens_per_s_tpot']:.2f}")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
