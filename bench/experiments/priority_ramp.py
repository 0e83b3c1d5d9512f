"""HyperFlexis Figure 6: responsiveness of HFX-PM to a dynamic ramp of priorities (§9.1).

The lowest priority's client (P3, wikisql) starts at 0 s; P2, P1 and P0 join at 20, 40 and 60 s,
each sending --qps requests/s until 90 s. Priorities replace SLOs (0 = most important); each
request is scored against its task's Table 1 SLO. For rr and hfx, writes per-second mean measured
TTFT and mean assigned TTFT SLO per priority, arrivals per second, attainment per priority (JSON),
and the figure (PNG). Not a test.

    python bench/experiments/priority_ramp.py --json docs/results/fig6-ramp.json \
        --png docs/results/fig6-ramp.png
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.evaluation.presets import SEED_DISPATCHER, SEED_ENGINE
from hfx.records.metrics import summarize
from hfx.sim.clock import run
from hfx.sim.driver import instance_spans, load_requests, resolve_profile, run_cluster

LEVELS = 4


def per_second(records, levels: int) -> dict:
    """Arrival second → per-priority (mean TTFT, mean assigned TTFT SLO, arrivals)."""
    acc: dict[int, dict[int, list]] = defaultdict(lambda: defaultdict(lambda: [[], [], 0]))
    for r in records:
        p, sec = r.request.priority, int(r.request.arrival)
        slot = acc[p][sec]
        slot[2] += 1
        if r.ttft is not None:
            slot[0].append(r.ttft)
        if r.slo is not None:
            slot[1].append(r.slo.ttft)
    out = {}
    for p in range(levels):
        secs = sorted(acc[p])
        out[str(p)] = {
            "second": secs,
            "ttft": [sum(acc[p][s][0]) / len(acc[p][s][0]) if acc[p][s][0] else None
                     for s in secs],
            "assigned_ttft": [sum(acc[p][s][1]) / len(acc[p][s][1]) for s in secs],
            "arrivals": [acc[p][s][2] for s in secs],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=float, default=15.0, help="per client (seed: 15)")
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    args = ap.parse_args()

    out: dict = {"qps_per_client": args.qps, "instances": args.instances, "policies": {}}
    for policy in ("rr", "hfx"):
        # Paper mode, as the presets: hfx on the seed's engine and dispatcher (HyperFlexis §7.1).
        seed = ({"planner": SEED_ENGINE, "policy_params": SEED_DISPATCHER} if policy == "hfx"
                else {})
        cfg = SimConfig(workload="ramp", policy=policy, qps=args.qps, priorities=LEVELS,
                        instances=args.instances, seed=args.seed, **seed)
        control, _ = run(run_cluster(cfg, load_requests(cfg), resolve_profile(cfg)),
                           virtual=True)
        records = list(control.records.values())
        summary = summarize(records, instance_spans(control))
        out["policies"][policy] = {
            "attainment": summary["attainment"],
            "per_priority": {p: v["attainment"] for p, v in summary["per_priority"].items()},
            "series": per_second(records, LEVELS),
        }
        print(policy, f"attainment {summary['attainment']:.3f}",
              {p: round(v["attainment"], 3) for p, v in summary["per_priority"].items()})
    write_json(args.json, out)

    fig, axes = plt.subplots(2, 2, figsize=(13, 7), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, policy in enumerate(("rr", "hfx")):
        ax, hist = axes[0][col], axes[1][col]
        series = out["policies"][policy]["series"]
        bottom = defaultdict(int)
        for p in range(LEVELS):
            s = series[str(p)]
            c = colors[p]
            ax.plot(s["second"], s["ttft"], color=c, label=f"P{p} measured TTFT")
            ax.plot(s["second"], s["assigned_ttft"], color=c, linestyle=":",
                    label=f"P{p} assigned TTFT SLO")
            hist.bar(s["second"], s["arrivals"], bottom=[bottom[x] for x in s["second"]],
                     color=c, width=1.0, label=f"P{p}")
            for x, n in zip(s["second"], s["arrivals"], strict=True):
                bottom[x] += n
        ax.set_yscale("log")
        ax.set_title(f"{policy}: attainment {out['policies'][policy]['attainment']:.2f}")
        ax.set_ylabel("TTFT (s), per-second mean")
        ax.grid(alpha=0.3)
        hist.set_xlabel("arrival time (s)")
        hist.set_ylabel("requests/s")
    axes[0][0].legend(fontsize=7, ncol=2)
    axes[1][0].legend(fontsize=7, ncol=4)
    fig.suptitle(f"Priority ramp (HyperFlexis Fig. 6): {args.qps:g} QPS per client, "
                 f"{args.instances} instance(s)")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
