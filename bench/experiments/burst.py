"""A bursty load: the four-task mix at --base QPS, three times that for 60 s, then back.

Runs hfx on a fixed fleet of 2 and hfx with the Scaler (2 → 4) loading weights from disk and by
device-to-device copy from a running peer, and writes per-second series — instances (active and
loading), queued requests, attainment of the requests arriving in that second — as JSON and a
plot. Not a test.

    python bench/experiments/burst.py --json docs/results/burst.json --png docs/results/burst.png
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.evaluation.presets import SEED_DISPATCHER, SEED_ENGINE, SEED_SCALER
from hfx.records.metrics import summarize
from hfx.sim.clock import run
from hfx.sim.driver import instance_spans, resolve_profile, run_cluster, scaling_summary
from hfx.workloads.load import phases


def per_second_attainment(records) -> dict[int, float]:
    met, n = defaultdict(int), defaultdict(int)
    for r in records:
        sec = int(r.request.arrival)
        n[sec] += 1
        met[sec] += r.meets_slo()
    return {s: met[s] / n[s] for s in sorted(n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=float, default=40.0, help="total QPS outside the burst")
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--burst", type=float, default=60.0, help="burst length, s")
    ap.add_argument("--calm", type=float, default=60.0, help="length before and after, s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    schedule = [(args.calm, args.base), (args.burst, args.base * args.factor),
                (args.calm, args.base)]
    requests = phases("four-task", schedule, args.seed)
    # Paper mode, as the presets: the seed's engine, dispatcher and Scaler signal (HyperFlexis
    # §7.1, HFX paper §3.3.3).
    seed_hfx = {"policy": "hfx", "planner": SEED_ENGINE, "policy_params": SEED_DISPATCHER,
                **SEED_SCALER}
    runs = {
        "hfx, 2 fixed": SimConfig(**seed_hfx),
        "hfx-scaling, disk": SimConfig(**seed_hfx, max_instances=4, weight_path="disk"),
        "hfx-scaling, d2d": SimConfig(**seed_hfx, max_instances=4, weight_path="d2d"),
    }
    out: dict = {"schedule": schedule, "requests": len(requests), "runs": {}}
    for label, cfg in runs.items():
        control, _ = run(run_cluster(cfg, requests, resolve_profile(cfg)), virtual=True)
        records = list(control.records.values())
        summary = summarize(records, instance_spans(control))
        entry = {"attainment": summary["attainment"], "e2e_mean": summary["e2e"]["mean"],
                 "ttft_p90": summary["ttft"]["p90"], "cost_units": summary["cost_units"],
                 "attainment_per_second": per_second_attainment(records)}
        if control.scaler is not None:
            entry.update(scaling_summary(control.scaler))
        out["runs"][label] = entry
        print(f"{label:20s} attainment {entry['attainment']:.3f}  E2E {entry['e2e_mean']:.2f} s"
              f"  cost {entry['cost_units']}")
    write_json(args.json, out)

    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (label, entry), color in zip(out["runs"].items(), palette, strict=False):
        att = entry["attainment_per_second"]
        axes[2].plot(list(att), list(att.values()), label=label, color=color)
        over = entry.get("instances_over_time")
        if over:
            t = [o["time"] for o in over]
            axes[0].step(t, [o["active"] + o["provisioning"] for o in over], where="post",
                         color=color, label=f"{label}: provisioned")
            axes[0].step(t, [o["colocated"] for o in over], where="post", linestyle=":",
                         color=color, label=f"{label}: serving")
            axes[1].plot(t, [o["queued"] for o in over], label=label, color=color)
    axes[0].axhline(2, color=palette[0], linewidth=0.8, label="hfx, 2 fixed")
    axes[0].set_ylabel("instances")
    axes[1].set_ylabel("requests without a\\nfirst token")
    axes[2].set_ylabel("attainment of\\narrivals per second")
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.axvspan(args.calm, args.calm + args.burst, color="orange", alpha=0.08)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Burst: four-task at {args.base:g} QPS, x{args.factor:g} for {args.burst:g} s")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
