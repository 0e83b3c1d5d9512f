"""Named sweeps that reproduce the seeds' experiments (``hfx sweep --preset NAME``).

A preset is a workload, a list of *series* (a label and the config fields it sets), a QPS grid,
and optionally the ratios to tabulate (numerator series / denominator series, per QPS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    description: str
    workload: str
    series: tuple[tuple[str, dict[str, Any]], ...]
    qps: tuple[float, ...]
    ratios: tuple[tuple[str, str], ...] = ()
    config: dict[str, Any] = field(default_factory=dict)


def _policies(*names: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple((n, {"policy": n}) for n in names)


PRESETS: dict[str, Preset] = {
    "fig3-four-task": Preset(
        "seed 000 Figure 3, colocated, 2 instances, four-task: hfx vs rr vs scorpio",
        "four-task", _policies("hfx", "rr", "scorpio"),
        (40, 60, 80, 100, 120, 140, 160, 200, 240),
        ratios=(("hfx", "rr"), ("hfx", "scorpio"))),
    "fig3-two-task": Preset(
        "seed 000 Figure 3, colocated, 2 instances, two-task: hfx vs rr vs scorpio",
        "two-task", _policies("hfx", "rr", "scorpio"),
        (40, 60, 80, 100, 120, 140, 160, 200, 240),
        ratios=(("hfx", "rr"), ("hfx", "scorpio"))),
    "fig7-wikisql": Preset(
        "seed 000 Figure 7, single task wikisql (TTFT 0.7 s, TPOT 0.5 s): hfx vs aladdin vs sa",
        "wikisql", _policies("hfx", "aladdin", "sa"), (10, 20, 30, 40, 45, 50, 60),
        ratios=(("hfx", "aladdin"), ("hfx", "sa"))),
    "fig4-four-task": Preset(
        "seed 000 Figure 4, P/D with 2 prefill + 2 decode instances, four-task: hfx vs rr-pd",
        "four-task", (("hfx", {"policy": "hfx"}), ("rr-pd", {"policy": "rr-pd"})),
        (40, 80, 120, 160, 200, 240, 280), ratios=(("hfx", "rr-pd"),),
        config={"mode": "pd", "prefill": 2, "decode": 2}),
    "fig4-two-task": Preset(
        "seed 000 Figure 4 setting on two-task, P/D 2 + 2: hfx vs rr-pd",
        "two-task", (("hfx", {"policy": "hfx"}), ("rr-pd", {"policy": "rr-pd"})),
        (40, 80, 120, 160, 200, 240, 280), ratios=(("hfx", "rr-pd"),),
        config={"mode": "pd", "prefill": 2, "decode": 2}),
    "fig5-four-task": Preset(
        "seed 000 Figure 5, four-task with priorities instead of SLOs: hfx-pm vs rr",
        "four-task", (("hfx-pm", {"policy": "hfx"}), ("rr", {"policy": "rr"})),
        (40, 80, 120, 160, 200, 240), ratios=(("hfx-pm", "rr"),), config={"priorities": 4}),
    "fig5-two-task": Preset(
        "seed 000 Figure 5, two-task with priorities instead of SLOs: hfx-pm vs rr",
        "two-task", (("hfx-pm", {"policy": "hfx"}), ("rr", {"policy": "rr"})),
        (40, 80, 120, 160, 200, 240), ratios=(("hfx-pm", "rr"),), config={"priorities": 2}),
    "mispredict": Preset(
        "hfx with its step-time predictions off by -20% / 0 / +20% from the executor's",
        "four-task",
        (("hfx -20%", {"policy": "hfx", "predictor_error": -0.2}),
         ("hfx exact", {"policy": "hfx", "predictor_error": 0.0}),
         ("hfx +20%", {"policy": "hfx", "predictor_error": 0.2}),
         ("rr", {"policy": "rr"})),
        (80, 120, 160, 200, 240),
        ratios=(("hfx -20%", "hfx exact"), ("hfx +20%", "hfx exact"))),
}
