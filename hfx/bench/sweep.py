"""Sweeps: a grid of (policy, QPS) runs, a table, a JSON file and a plot like seed 000 Figure 3."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt
from tqdm import tqdm

from hfx.config import SimConfig
from hfx.sim import simulate


def run_grid(base: SimConfig, policies: Iterable[str], qps: Iterable[float],
             jobs: int | None = None, progress: bool = True) -> list[dict]:
    """Every (policy, qps) pair of ``base``; results ordered by policy, then QPS."""
    configs = [SimConfig(**{**base.model_dump(), "policy": p, "qps": q})
               for p in policies for q in qps]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(configs)))
    results: list[dict | None] = [None] * len(configs)
    bar = tqdm(total=len(configs), desc="sweep", unit="run", disable=not progress or None)
    if jobs == 1:
        for i, cfg in enumerate(configs):
            results[i] = simulate(cfg)
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(simulate, cfg): i for i, cfg in enumerate(configs)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                bar.update()
    bar.close()
    return [r for r in results if r is not None]


def table(results: list[dict]) -> str:
    head = (f"{'policy':<14}{'qps':>7}{'attain':>8}{'dslo':>7}{'ttft p90':>10}{'tpot mean':>11}"
            f"{'e2e mean':>10}{'cost':>9}{'goodput':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['policy']:<14}{r['qps']:>7g}{r['attainment']:>8.3f}{r['attainment_dslo']:>7.3f}"
            f"{_fmt(r['ttft']['p90']):>10}{_fmt(r['tpot']['mean']):>11}{_fmt(r['e2e']['mean']):>10}"
            f"{r['cost_units']:>9}{r['goodput_rps']:>9.2f}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot(results: list[dict], path: str | Path, title: str = "") -> None:
    """Attainment, mean E2E latency and cost against QPS, one line per policy (seed Fig. 3)."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("attainment", "SLO attainment", lambda r: r["attainment"]),
              ("e2e", "mean E2E latency (s)", lambda r: r["e2e"]["mean"]),
              ("cost", "cost (instance·50 ms units)", lambda r: r["cost_units"]))
    policies = list(dict.fromkeys(r["policy"] for r in results))
    for ax, (_, label, get) in zip(axes, panels, strict=True):
        for pol in policies:
            rows = sorted((r for r in results if r["policy"] == pol), key=lambda r: r["qps"])
            ax.plot([r["qps"] for r in rows], [get(r) for r in rows], marker="o", label=pol)
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
