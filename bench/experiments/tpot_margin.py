"""HFX's capacity with its TPOT guard aimed at a share of each target (``tpot_margin``): each
cell's search under both metrics, as compare.py runs HFX's (its table's setting, its engine),
once per margin (hfx_params.py with one ``tpot_margin`` variant per margin). Writes JSON; not a
test.

    python bench/experiments/tpot_margin.py --margins 1.0,0.95,0.9,0.85 \
        --cells slos-serve-mixed@2:100 --run tuning --jobs 2 \
        --json docs/data/tpot_margin/held_out.json
    python bench/experiments/tpot_margin.py --margins 1.0,0.9 \
        --cells tiered-512-512@20:0,1 --table compare_whole/own_engines_1024_20 \
        --jobs 2 --json docs/data/tpot_margin/tiered_20.json

A cell is ``WORKLOAD@INSTANCES:SEEDS``. Each search starts warm where the table found HFX (the
same workload, fleet and seed; ``--warm`` names another table), else where compare.py starts
it. ``--run tuning`` probes as the tuning does (90 s after 20 s), ``evaluation`` as the tables.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hfx.evaluation import write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hfx_params import add_search_args, run_variants, value  # type: ignore[import-not-found]  # a sibling script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--margins", default="off,learned",
                    help="tpot_margin values: learned, off (the seed's) or a share")
    add_search_args(ap)
    args = ap.parse_args()
    margins = [value(m) for m in args.margins.split(",")]
    body = run_variants([{"tpot_margin": m} for m in margins], args.cells, args.table,
                        args.warm, args.regime, args.run, args.jobs)
    for row in body["searches"]:
        row["margin"] = row["params"]["tpot_margin"]
    write_json(args.json, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
