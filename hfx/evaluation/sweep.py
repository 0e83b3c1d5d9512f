"""Sweeps: a grid of (series, QPS) runs, a table, a JSON file and a plot like HyperFlexis
Figure 3."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt

from hfx.config import SimConfig
from hfx.evaluation.runner import run_all
from hfx.sim.driver import simulate


def run_grid(base: SimConfig, series: Iterable[tuple[str, dict]], qps: Iterable[float],
             jobs: int | None = None, progress: bool = True, seeds: int = 1,
             ray_address: str | None = None) -> list[dict]:
    """Every (series, qps) pair on top of ``base``, for ``seeds`` workload seeds from
    ``base.seed`` on; results ordered by series, then QPS, then seed. Runs go to ``jobs``
    processes, or to the Ray cluster at ``ray_address`` (hfx/evaluation/runner.py).

    A series is a label and the config fields it sets (``("hfx", {"policy": "hfx"})``); each
    result carries its label under ``series``.
    """
    labelled = [(label, SimConfig(**{**base.model_dump(), **fields, "qps": q,
                                     "seed": base.seed + i}))
                for label, fields in series for q in qps for i in range(seeds)]
    results = run_all(simulate, [(cfg,) for _, cfg in labelled], jobs, ray_address, progress,
                      desc="sweep")
    for (label, _), r in zip(labelled, results, strict=True):
        r["series"] = label
    return results


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def aggregate(results: list[dict]) -> list[dict]:
    """One row per (series, QPS): a single run as it is; several seeds' runs as their means,
    with ``attainment_std`` and ``seeds`` (the count)."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in results:
        groups.setdefault((r["series"], r["qps"]), []).append(r)
    rows = []
    for (name, q), runs in groups.items():
        if len(runs) == 1:
            rows.append({**runs[0], "seeds": 1, "attainment_std": 0.0})
            continue
        att = [r["attainment"] for r in runs]
        rows.append({
            "series": name, "qps": q, "seeds": len(runs), "config": runs[0]["config"],
            "instances": runs[0]["instances"],
            "attainment": statistics.fmean(att), "attainment_std": statistics.stdev(att),
            "attainment_dslo": statistics.fmean(r["attainment_dslo"] for r in runs),
            "ttft": {"p90": _mean(r["ttft"]["p90"] for r in runs)},
            "tpot": {"mean": _mean(r["tpot"]["mean"] for r in runs)},
            "e2e": {"mean": _mean(r["e2e"]["mean"] for r in runs)},
            "cost_units": round(statistics.fmean(r["cost_units"] for r in runs)),
            "goodput_rps": statistics.fmean(r["goodput_rps"] for r in runs),
            "hit_rate": statistics.fmean(r.get("hit_rate", 0.0) for r in runs)})
    return rows


def table(results: list[dict]) -> str:
    """Per series and QPS (the mean over seeds, attainment ± its std when there are several)."""
    rows = aggregate(results)
    spread = any(r["seeds"] > 1 for r in rows)
    std_head = f"{'± std':>7}" if spread else ""
    head = (f"{'series':<14}{'qps':>7}{'attain':>8}{std_head}{'dslo':>7}"
            f"{'ttft p90':>10}{'tpot mean':>11}{'e2e mean':>10}{'cost':>9}{'goodput':>9}"
            f"{'hits':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        std = f"{r['attainment_std']:>7.3f}" if spread else ""
        lines.append(
            f"{r['series']:<14}{r['qps']:>7g}{r['attainment']:>8.3f}{std}"
            f"{r['attainment_dslo']:>7.3f}{_fmt(r['ttft']['p90']):>10}"
            f"{_fmt(r['tpot']['mean']):>11}{_fmt(r['e2e']['mean']):>10}"
            f"{r['cost_units']:>9}{r['goodput_rps']:>9.2f}{r.get('hit_rate', 0.0):>6.2f}")
    return "\n".join(lines)


def ratio_table(results: list[dict], pairs: Iterable[tuple[str, str]]) -> str:
    """Per QPS: attainment ratio and mean-E2E reduction of each (numerator, denominator) pair."""
    by = {(r["series"], r["qps"]): r for r in aggregate(results)}
    qps = sorted({r["qps"] for r in results})
    lines = []
    for num, den in pairs:
        lines.append(f"{num} / {den}: attainment ratio, mean E2E change")
        for q in qps:
            a, b = by.get((num, q)), by.get((den, q))
            if a is None or b is None:
                continue
            ratio = a["attainment"] / b["attainment"] if b["attainment"] else float("inf")
            e_a, e_b = a["e2e"]["mean"], b["e2e"]["mean"]
            change = (e_a - e_b) / e_b * 100 if e_a is not None and e_b else float("nan")
            lines.append(f"  qps {q:>6g}: {ratio:6.2f}x  {change:+6.1f}%")
    return "\n".join(lines)


def capacity(results: list[dict], metric: str = "attainment", threshold: float = 0.9
             ) -> dict[str, float | None]:
    """SLOs-Serve's capacity reading (SLOs-Serve §6.1): per series, the highest QPS per instance
    at which ``metric`` (the mean over seeds) stays ≥ ``threshold``, interpolated linearly
    between grid points; None if even the lowest QPS misses it. On finite traces this is where
    a draining trace crosses the threshold, not a rate the fleet sustains (``hfx capacity``)."""
    results = aggregate(results)
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(r["series"] for r in results):
        rows = sorted((r for r in results if r["series"] == name), key=lambda r: r["qps"])
        best = None
        for lo, hi in zip([None, *rows], rows, strict=False):
            if hi[metric] >= threshold:
                best = hi["qps"]
                continue
            if lo is not None and lo[metric] >= threshold:
                frac = (lo[metric] - threshold) / (lo[metric] - hi[metric])
                best = lo["qps"] + frac * (hi["qps"] - lo["qps"])
            break
        n = rows[0]["config"].get("max_instances") or rows[0]["instances"]
        out[name] = None if best is None else best / n
    return out


def capacity_table(results: list[dict]) -> str:
    steady = results[0]["config"].get("duration") is not None
    title = ("steady-state knee: QPS per instance where this grid's attainment crosses 90% "
             "(Eq. 4 / deadline-based); bisect with hfx capacity for the rate itself" if steady
             else "finite-trace knee: QPS per instance where this grid's attainment crosses 90%"
             " (Eq. 4 / deadline-based); the trace drains after its last arrival, so this is "
             "not a sustained rate: use --duration, or hfx capacity")
    lines = [title]
    eq4, dslo = capacity(results), capacity(results, "attainment_dslo")
    for name in eq4:
        fmt = [("-" if v is None else f"{v:.1f}") for v in (eq4[name], dslo[name])]
        lines.append(f"  {name:<24}{fmt[0]:>8}{fmt[1]:>8}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot(results: list[dict], path: str | Path, title: str = "") -> None:
    """Attainment, mean E2E latency and cost against QPS, one line per series (seed Fig. 3)."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("attainment", "SLO attainment", lambda r: r["attainment"]),
              ("e2e", "mean E2E latency (s)", lambda r: r["e2e"]["mean"]),
              ("cost", "cost (instance·50 ms units)", lambda r: r["cost_units"]))
    results = aggregate(results)
    series = list(dict.fromkeys(r["series"] for r in results))
    for ax, (key, label, get) in zip(axes, panels, strict=True):
        for name in series:
            rows = sorted((r for r in results if r["series"] == name), key=lambda r: r["qps"])
            err = [r["attainment_std"] for r in rows] if key == "attainment" else None
            ax.errorbar([r["qps"] for r in rows], [get(r) for r in rows], yerr=err,
                        marker="o", label=name, capsize=3)
        ax.set_xlabel("QPS")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(results: list[dict], out_dir: str | Path, name: str,
          title: str = "") -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"{name}.json", out / f"{name}.png"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, png_path, title)
    return json_path, png_path
