"""What the sizes of HFX's tier parts decide at PolyServe's fleet size: one run of HFX as the
whole-systems table tunes it (its engine, its setting) at one rate, with the parts sized as
they come out (``auto``) and with each split given, and every tier's attainment under both
metrics (docs/results.md, "20 instances, PolyServe's own setting"). Writes JSON; not a test.

A given split replaces what ``TierParts`` sizes once the parts are on (the gate, the tiers'
order and everything else as shipped): a what-if for the sizing, not an option of HFX.

    python bench/experiments/part_sizes.py --qps 640 --splits auto,3-5-6-6,3-5-5-7,2-5-6-7 \
        --jobs 2 --json docs/data/tier_parts/sizes_640.json
    python bench/experiments/part_sizes.py --qps 640 --splits auto --margin off \
        --jobs 1 --json docs/data/tpot_margin/parts_640_off.json  # the guard's margin off
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hfx.evaluation import code_commit, write_json
from hfx.evaluation.compare import CONTENDERS, EVALUATION_RUN, WORKLOAD_CONFIG
from hfx.policies import tier_parts
from hfx.sim.driver import simulate

ROOT = Path(__file__).resolve().parents[2]
TUNED = ROOT / "docs/data/compare_whole/own_engines_1024.json"  # HFX's setting, as the table's


def run(workload: str, qps: float, seed: int, instances: int, split: str,
        margin: str) -> dict[str, Any]:
    if split != "auto":
        sizes = [int(n) for n in split.split("-")]
        shipped = tier_parts.TierParts._sizing

        def given(self: tier_parts.TierParts, ids: tuple[int, ...], tiers: tuple[float, ...],
                  fixed: float) -> list[int] | None:
            got = shipped(self, ids, tiers, fixed)
            return sizes if got is not None and len(got) == len(sizes) else got

        tier_parts.TierParts._sizing = given  # type: ignore[method-assign]  # this process's
    chosen: list[list[int]] = []
    resize = tier_parts.TierParts._resize

    def noted(self: tier_parts.TierParts, ids: tuple[int, ...], tiers: tuple[float, ...],
              sizes: list[int], now: float) -> None:
        chosen.append(list(sizes))
        resize(self, ids, tiers, sizes, now)

    tier_parts.TierParts._resize = noted  # type: ignore[method-assign]
    setting = json.loads(TUNED.read_text())["tuning"]["hfx"]["1024"]["chosen"]
    if margin:
        setting = {**setting, "policy_params": {**setting.get("policy_params", {}),
                                                "tpot_margin": margin}}
    fields = {**WORKLOAD_CONFIG.get(workload, {}), "workload": workload, "seed": seed,
              "instances": instances, "max_num_seqs": 1024}
    config = CONTENDERS["hfx"].config(setting, None, qps=qps,
                                      duration=EVALUATION_RUN["duration"],
                                      warmup=EVALUATION_RUN["warmup"], **fields)
    r = simulate(config)
    return {"split": split, "margin": margin or "shipped", "seed": seed,
            "sizes_used": chosen[-1] if chosen else None,
            "attainment": r["attainment"], "attainment_dslo": r["attainment_dslo"],
            "backlog_at_end": r["backlog_at_end"],
            "tiers": {t: {"requests": s["requests"], "attainment": s["attainment"],
                          "attainment_dslo": s["attainment_dslo"],
                          "best_effort": s["best_effort"], "ttft_p99": s["ttft"]["p99"],
                          "tpot_mean": s["tpot"]["mean"], "tpot_p99": s["tpot"]["p99"]}
                      for t, s in sorted(r["per_task"].items())}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="tiered-512-512")
    ap.add_argument("--qps", type=float, default=640.0)
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--margin", default="", help="HFX's tpot_margin (default: as shipped)")
    ap.add_argument("--splits", default="auto,3-5-6-6,3-5-5-7,2-5-6-7",
                    help="auto (as shipped) or instances per tier, strictest first")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    calls = [(args.workload, args.qps, int(s), args.instances, split, args.margin)
             for split in args.splits.split(",") for s in args.seeds.split(",")]
    # One process per run: a given split patches its own process only.
    with ProcessPoolExecutor(args.jobs, max_tasks_per_child=1) as pool:
        rows = list(pool.map(run, *zip(*calls, strict=True)))
    for r in rows:
        tiers = " ".join(f"{t} {s['attainment']:.3f}" for t, s in r["tiers"].items())
        print(f"{r['split']:>8} seed {r['seed']} sizes {r['sizes_used']}: "
              f"{r['attainment']:.3f} / {r['attainment_dslo']:.3f}  ({tiers})", file=sys.stderr)
    write_json(args.json, {"command": " ".join(["python", *sys.argv]), "commit": code_commit(),
                           "date": datetime.date.today().isoformat(), "workload": args.workload,
                           "qps": args.qps, "instances": args.instances, "runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
