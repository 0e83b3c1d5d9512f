"""How far two tunings of the same code score one setting apart: the tuning's resolution
(``TUNING_TIE`` in hfx/evaluation/compare.py). Reads comparison JSONs; runs nothing; writes JSON.

Each pair is two results of the same protocol and code, e.g. a cold run and a warm rerun
(compare.py ``--warm``). A side is a path, or ``REV:PATH`` for that file at a git revision:

    python bench/sim/tuning_noise.py \\
        2985a5c:docs/data/compare_engine/vllm_1024.json=docs/data/compare_engine/vllm_1024.json \\
        --json docs/data/tuning_noise.json

Per setting, |score_b / score_a - 1| (a score is the geometric mean of the setting's two
crossings); the distribution over every setting both sides tuned, and the same for each pair.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from hfx.evaluation import write_json
from hfx.evaluation.compare import _setting_key


def load(side: str) -> dict:
    if ":" in side and not Path(side).exists():
        rev, path = side.split(":", 1)
        text = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True,
                              text=True, check=True).stdout
        return json.loads(text)
    return json.loads(Path(side).read_text())


def scores(result: dict) -> dict[tuple[str, str, str], float]:
    """Every tuned setting's score, keyed (contender, regime, setting)."""
    out = {}
    for name, by_regime in result.get("tuning", {}).items():
        for regime, t in by_regime.items():
            for setting, score in zip(t["settings"], t["scores"], strict=True):
                out[(name, regime, _setting_key(setting))] = score
    return out


def quantiles(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    if not v:
        return {"settings": 0}
    at = lambda q: round(v[min(len(v) - 1, int(q * len(v)))], 4)  # noqa: E731
    return {"settings": len(v), "median": at(0.5), "p90": at(0.9), "p95": at(0.95),
            "max": round(v[-1], 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="A=B", help="two results of the same code")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    rows, every = [], []
    for pair in args.pairs:
        a_side, _, b_side = pair.partition("=")
        if not b_side:
            ap.error(f"{pair!r}: a pair is A=B")
        a, b = scores(load(a_side)), scores(load(b_side))
        apart = [abs(b[k] / a[k] - 1) for k in a.keys() & b.keys() if a[k] > 0 and b[k] > 0]
        every += apart
        rows.append({"a": a_side, "b": b_side, **quantiles(apart)})
        print(f"{b_side}: {rows[-1]}", file=sys.stderr)
    out = {"command": "python bench/sim/tuning_noise.py " + " ".join(args.pairs)
           + (f" --json {args.json}" if args.json else ""),
           "date": datetime.date.today().isoformat(), "pairs": rows, "all": quantiles(every)}
    print(json.dumps(out["all"]))
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
