"""``hfx whatif``: one trace — recorded by ``hfx serve --record`` or a public one —
replayed under every (policy, fleet size) on the simulator, which is the serving code on a
virtual clock; the answer an operator asks first: the smallest fleet that meets the SLO target,
per policy, and what each costs.

Every run is ``simulate`` with the trace as its workload (arrivals, lengths and SLOs from the
trace), the given profile (``FILE.profile.json`` beside a recording is what the dispatcher
planned with), and the fleet size as ``--instances``; runs go to local processes or Ray
(``hfx.evaluation.runner.run_all``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfx.config import SimConfig
from hfx.evaluation.runner import run_all

SUMMARY_KEYS = ("attainment", "attainment_dslo", "cost_units", "goodput_rps", "finished",
                "requests", "backlog_at_end", "hit_rate")


def _run(config: SimConfig) -> dict[str, Any]:
    from hfx.sim.driver import simulate

    return simulate(config)


def whatif(base: SimConfig, policies: list[str], fleets: list[int], target: float,
           jobs: int | None = None, ray_address: str | None = None,
           progress: bool = True, capacity: bool = False) -> dict[str, Any]:
    """Every (policy, fleet size) on ``base``'s workload; the smallest fleet per policy whose
    attainment (HyperFlexis Eq. 4) meets ``target``, and the same under per-token deadlines.
    ``capacity``: also each point's capacity, the highest rate of this trace (rescaled:
    ``--trace-qps``) it carries at ``target`` (hfx/evaluation/capacity.py)."""
    if base.mode != "colocated":
        raise ValueError("hfx whatif sizes colocated fleets (--instances); run P/D splits "
                         "with hfx sim --mode pd")
    configs = [base.model_copy(update={"policy": p, "instances": n})
               for p in policies for n in fleets]
    for c in configs:  # every point valid before anything runs
        SimConfig.model_validate(c.model_dump())
    results = run_all(_run, [(c,) for c in configs], jobs, ray_address, progress,
                      desc="what-if")
    rows = []
    for c, r in zip(configs, results, strict=True):
        rows.append({"policy": c.policy, "instances": c.instances,
                     **{k: r.get(k) for k in SUMMARY_KEYS},
                     "ttft_mean": r["ttft"]["mean"], "tpot_mean": r["tpot"]["mean"],
                     "ttft_p99": r["ttft"]["p99"]})
    if capacity:
        from hfx.evaluation.capacity import seed_capacity

        found = run_all(seed_capacity, [(c, target) for c in configs], jobs, ray_address,
                        progress, desc="capacity")
        for row, cap in zip(rows, found, strict=True):
            row["capacity_qps"] = cap["capacity"]
    return {"workload": base.workload, "profile": base.profile, "target": target,
            "rows": rows, "smallest": _smallest(rows, target, "attainment"),
            "smallest_dslo": _smallest(rows, target, "attainment_dslo")}


def _smallest(rows: list[dict[str, Any]], target: float, metric: str) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for row in rows:
        out.setdefault(row["policy"], None)
        best = out[row["policy"]]
        if row[metric] >= target and (best is None or row["instances"] < best):
            out[row["policy"]] = row["instances"]
    return out


def table(result: dict[str, Any]) -> str:
    lines = [f"{'policy':<14} {'inst':>4} {'attain':>7} {'dslo':>7} {'cost':>9} "
             f"{'TTFT mean':>10} {'TPOT mean':>10} {'hits':>5}"
             + (f" {'capacity':>9}" if "capacity_qps" in result["rows"][0] else "")]
    for r in result["rows"]:
        lines.append(f"{r['policy']:<14} {r['instances']:>4} {r['attainment']:>7.3f} "
                     f"{r['attainment_dslo']:>7.3f} {r['cost_units']:>9.0f} "
                     f"{_ms(r['ttft_mean']):>10} {_ms(r['tpot_mean']):>10} "
                     f"{r['hit_rate']:>5.2f}"
                     + (f" {r['capacity_qps']:>9.3g}" if "capacity_qps" in r else ""))
    most = max(r["instances"] for r in result["rows"])

    def sizes(smallest: dict[str, int | None]) -> str:
        return ", ".join(f"{p} {n if n is not None else f'more than {most}'}"
                         for p, n in smallest.items())

    lines.append(f"smallest fleet at attainment >= {result['target']:g}: "
                 f"{sizes(result['smallest'])}")
    lines.append(f"  under per-token deadlines: {sizes(result['smallest_dslo'])}")
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def plot(result: dict[str, Any], path: str | Path) -> None:
    """Attainment and cost against fleet size, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (att, cost) = plt.subplots(1, 2, figsize=(10, 4))
    for policy in result["smallest"]:
        rows = sorted((r for r in result["rows"] if r["policy"] == policy),
                      key=lambda r: r["instances"])
        xs = [r["instances"] for r in rows]
        att.plot(xs, [r["attainment"] for r in rows], marker="o", label=policy)
        cost.plot(xs, [r["cost_units"] for r in rows], marker="o", label=policy)
    att.axhline(result["target"], color="grey", linestyle="--", linewidth=1)
    att.set(xlabel="instances", ylabel="SLO attainment (Eq. 4)", ylim=(0, 1.02))
    cost.set(xlabel="instances", ylabel="cost (50 ms units)")
    att.legend()
    fig.suptitle(Path(result["workload"]).name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
