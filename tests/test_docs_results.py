"""docs/results.md's paper-mode figures reproduce with their commands.

Each case reruns one point of a committed ``hfx sweep --preset`` result (the CLI, as the docs
run it) and compares it with the JSON in docs/results/. A change of any default that moves the
paper-mode figures (step noise, the seed's engine, a preset's fleet) fails here, and the fix is
to rerun the preset and rewrite its section: the docs were once left a round behind.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hfx.cli import main

RESULTS = Path(__file__).parent.parent / "docs" / "results"

# (preset, QPS): colocated past the knee, P/D, the Scaler, priorities.
POINTS = [("fig3-four-task", 240.0), ("fig4-two-task", 240.0),
          ("fig3-scaling-four-task", 160.0), ("fig5-two-task", 160.0)]
FIELDS = (("attainment",), ("attainment_dslo",), ("finished",), ("ttft", "p90"),
          ("e2e", "mean"), ("cost_units",))


def _point(results: list[dict], qps: float) -> dict[str, dict]:
    return {r["series"]: r for r in results if r["qps"] == qps}


@pytest.mark.parametrize(("preset", "qps"), POINTS, ids=[p for p, _ in POINTS])
def test_paper_mode_point_reproduces(preset: str, qps: float, tmp_path: Path) -> None:
    assert main(["sweep", "--preset", preset, "--qps", str(qps), "--jobs", "1",
                 "--out", str(tmp_path)]) == 0
    now = _point(json.loads((tmp_path / f"{preset}.json").read_text()), qps)
    docs = _point(json.loads((RESULTS / f"{preset}.json").read_text()), qps)
    assert now.keys() == docs.keys()
    for series, result in now.items():
        for path in FIELDS:
            got, want = result, docs[series]
            for key in path:
                got, want = got[key], want[key]
            assert math.isclose(got, want, rel_tol=1e-9), (
                f"{preset} {series} @ {qps:g} QPS: {'.'.join(path)} is {got}, docs/results "
                f"say {want}; rerun `hfx sweep --preset {preset} --out docs/results` and "
                "update its section of docs/results.md")
