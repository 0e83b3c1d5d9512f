"""Named sweeps that reproduce the seeds' experiments (``hfx sweep --preset NAME``).

A preset is a workload, a list of *series* (a label and the config fields it sets), a QPS grid,
and optionally the ratios to tabulate (numerator series / denominator series, per QPS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEED_ENGINE = "prefill-first"  # the seeds' vLLM-Ascend (HyperFlexis §7.1)
# Algorithm 1 as the seed has it (hfx.py): no override, mature instances served in maturity
# order, each one's next maturity after its batch's whole prefill.
SEED_DISPATCHER = {"override": "off", "mature_order": "maturity", "prefill_wait": "batch",
                   "queue_order": "arrival", "best_effort": "drained", "parts": "off",
                   "tpot_margin": "off"}
SEED_SCALER = {"wait_indicator": "mean"}  # W over the whole queue (HFX paper §3.3.3; scaler.py)


@dataclass(frozen=True)
class Preset:
    """Paper mode: an ``hfx`` series runs on the seed's engine unless it names a planner, with
    the seed's dispatcher unless it names its parameters, and the seed's Scaler signal unless
    it names one, so a preset reproduces the seed's figure (and docs/results.md) whatever
    HFX's defaults are."""

    description: str
    workload: str
    series: tuple[tuple[str, dict[str, Any]], ...]
    qps: tuple[float, ...]
    ratios: tuple[tuple[str, str], ...] = ()
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        pinned = tuple((label, {"planner": SEED_ENGINE, "policy_params": SEED_DISPATCHER,
                                **SEED_SCALER, **fields})
                       if fields.get("policy") == "hfx" and "planner" not in self.config
                       else (label, fields) for label, fields in self.series)
        object.__setattr__(self, "series", pinned)


def _policies(*names: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple((n, {"policy": n}) for n in names)


PRESETS: dict[str, Preset] = {
    "fig3-four-task": Preset(
        "HyperFlexis Figure 3, colocated, 2 instances, four-task: hfx vs rr vs scorpio",
        "four-task", _policies("hfx", "rr", "scorpio"),
        (40, 60, 80, 100, 120, 140, 160, 200, 240),
        ratios=(("hfx", "rr"), ("hfx", "scorpio"))),
    "fig3-two-task": Preset(
        "HyperFlexis Figure 3, colocated, 2 instances, two-task: hfx vs rr vs scorpio",
        "two-task", _policies("hfx", "rr", "scorpio"),
        (40, 60, 80, 100, 120, 140, 160, 200, 240),
        ratios=(("hfx", "rr"), ("hfx", "scorpio"))),
    "fig7-wikisql": Preset(
        "HyperFlexis Figure 7, single task wikisql (TTFT 0.7 s, TPOT 0.5 s): hfx vs aladdin vs sa",
        "wikisql", _policies("hfx", "aladdin", "sa"), (10, 20, 30, 40, 45, 50, 60),
        ratios=(("hfx", "aladdin"), ("hfx", "sa"))),
    "fig4-four-task": Preset(
        "HyperFlexis Figure 4, P/D with 2 prefill + 2 decode instances, four-task: hfx vs rr-pd",
        "four-task", (("hfx", {"policy": "hfx"}), ("rr-pd", {"policy": "rr-pd"})),
        (40, 80, 120, 160, 200, 240, 280), ratios=(("hfx", "rr-pd"),),
        config={"mode": "pd", "prefill": 2, "decode": 2}),
    "fig4-two-task": Preset(
        "HyperFlexis Figure 4 setting on two-task, P/D 2 + 2: hfx vs rr-pd",
        "two-task", (("hfx", {"policy": "hfx"}), ("rr-pd", {"policy": "rr-pd"})),
        (40, 80, 120, 160, 200, 240, 280), ratios=(("hfx", "rr-pd"),),
        config={"mode": "pd", "prefill": 2, "decode": 2}),
    "fig5-four-task": Preset(
        "HyperFlexis Figure 5, four-task with priorities instead of SLOs: hfx-pm vs rr",
        "four-task", (("hfx-pm", {"policy": "hfx"}), ("rr", {"policy": "rr"})),
        (40, 80, 120, 160, 200, 240), ratios=(("hfx-pm", "rr"),), config={"priorities": 4}),
    "fig5-two-task": Preset(
        "HyperFlexis Figure 5, two-task with priorities instead of SLOs: hfx-pm vs rr",
        "two-task", (("hfx-pm", {"policy": "hfx"}), ("rr", {"policy": "rr"})),
        (40, 80, 120, 160, 200, 240), ratios=(("hfx-pm", "rr"),), config={"priorities": 2}),
    "fig3-scaling-four-task": Preset(
        "HyperFlexis Figure 3 with scaling, four-task: hfx-scaling (2 → 4) vs hfx, rr, scorpio (2)",
        "four-task",
        (("hfx-scaling", {"policy": "hfx", "max_instances": 4}), *_policies("hfx", "rr",
                                                                            "scorpio")),
        (40, 60, 80, 100, 120, 160, 200, 240),
        ratios=(("hfx-scaling", "rr"), ("hfx-scaling", "scorpio"))),
    "fig3-scaling-two-task": Preset(
        "HyperFlexis Figure 3 with scaling, two-task: hfx-scaling (2 → 4) vs hfx, rr, scorpio (2)",
        "two-task",
        (("hfx-scaling", {"policy": "hfx", "max_instances": 4}), *_policies("hfx", "rr",
                                                                            "scorpio")),
        (40, 80, 120, 160, 200, 240),
        ratios=(("hfx-scaling", "rr"), ("hfx-scaling", "scorpio"))),
    "pd-scaling": Preset(
        "P/D scaling, four-task: hfx-pd-scaling (4 → 8) vs hfx-pd and rr-pd (2 + 2); and the "
        "Scaler with W per SLO class (ours)",
        "four-task",
        (("hfx-pd-scaling", {"policy": "hfx", "max_instances": 8}),
         ("hfx-pd", {"policy": "hfx"}), ("rr-pd", {"policy": "rr-pd"}),
         ("hfx-pd-scaling W/class", {"policy": "hfx", "max_instances": 8,
                                     "wait_indicator": "per-class"})),
        (80, 120, 160, 200, 240, 280, 320),
        ratios=(("hfx-pd-scaling", "rr-pd"), ("hfx-pd-scaling", "hfx-pd"),
                ("hfx-pd-scaling W/class", "hfx-pd-scaling")),
        config={"mode": "pd", "prefill": 2, "decode": 2}),
    "fig8-monitor": Preset(
        "HyperFlexis Figure 8 (top): Qwen2.5-32B, four-task, 2 instances, hfx, monitor interval",
        "four-task",
        tuple((f"monitor {m:g}s", {"policy": "hfx", "monitor_interval": m})
              for m in (0.05, 1.0, 5.0)),
        (10, 20, 30, 40, 50, 60, 80), config={"model": "qwen2.5-32b"}),
    "fig8-scaling": Preset(
        "HyperFlexis Figure 8 (bottom): Qwen2.5-32B, four-task, hfx up to 4 instances, scaling "
        "interval",
        "four-task",
        tuple((f"scaling {t:g}s", {"policy": "hfx", "max_instances": 4, "scaling_interval": t})
              for t in (0.5, 1.0, 2.0)),
        (10, 20, 30, 40, 50, 60, 80), config={"model": "qwen2.5-32b"}),
    "peers-four-task": Preset(
        "exp. 1 (docs/results.md): hfx vs slos-serve vs polyserve vs rr, four-task, 2 instances",
        "four-task", _policies("hfx", "slos-serve", "polyserve", "rr"),
        (40, 80, 120, 160, 200, 240), ratios=(("hfx", "slos-serve"), ("hfx", "polyserve"))),
    "peers-two-task": Preset(
        "exp. 1 (docs/results.md): hfx vs slos-serve vs polyserve vs rr, two-task, 2 instances",
        "two-task", _policies("hfx", "slos-serve", "polyserve", "rr"),
        (40, 80, 120, 160, 200, 240), ratios=(("hfx", "slos-serve"), ("hfx", "polyserve"))),
    "peers-four-task-scaling": Preset(
        "exp. 1 (docs/results.md), each system's own scaling up to 4 instances, four-task",
        "four-task",
        (("hfx-scaling", {"policy": "hfx", "instances": 2, "max_instances": 4}),
         ("slos-serve", {"policy": "slos-serve", "instances": 4}),
         ("polyserve", {"policy": "polyserve", "instances": 4}),
         ("rr", {"policy": "rr", "instances": 4})),
        (80, 160, 240, 320, 400), ratios=(("hfx-scaling", "slos-serve"),
                                          ("hfx-scaling", "polyserve"))),
    "polyserve-512": Preset(
        "PolyServe's setting (PolyServe §5.1): 20 x Llama-3.1-8B on H200, uniform 512/512, TPOT "
        "tiers 20/30/50/100 ms",
        "tiered-512-512", _policies("hfx", "slos-serve", "polyserve", "rr"),
        (400, 800, 1200, 1600),
        config={"instances": 20, "model": "llama-3.1-8b", "hardware": "h200",
                "requests_per_task": 750}),
    "polyserve-4096": Preset(
        "PolyServe's setting (PolyServe §5.1): 20 x Llama-3.1-8B on H200, uniform 4096/1024",
        "tiered-4096-1024", _policies("hfx", "slos-serve", "polyserve", "rr"),
        (50, 100, 150, 200),
        config={"instances": 20, "model": "llama-3.1-8b", "hardware": "h200",
                "requests_per_task": 250}),
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
