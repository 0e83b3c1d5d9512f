"""One evaluation protocol for every policy: the same engine terms, the same tuning
budget, both SLO metrics.

1. **Contenders.** Each policy runs on its own engine planner; HFX runs twice, as shipped and as
   the paper has it (HyperFlexis §5.1's dispatcher without our override, on the prefill-first
   engine the paper's vLLM runs). Each has a grid of at most 12 settings of its own main knobs
   (``CONTENDERS``), whatever it ships with among them.
2. **Tuning.** Every setting's capacity is searched on a workload and seed that are evaluated
   nowhere (``TUNING_WORKLOAD``: every task of HyperFlexis Table 1 at once; ``TUNING_SEED``),
   once per engine regime, scored by the geometric mean of its crossings (below) under the two
   metrics. Each grid lists the contender's shipped setting first; the first setting listed
   whose score is within the tuning's resolution (``TUNING_TIE``) of the best is kept
   (``choose``), so a setting is chosen over the shipped one only by beating it beyond what
   two searches of one setting differ by.
3. **Evaluation.** Each tuned contender's capacity on every workload × seed × engine regime
   (``max_num_seqs`` 256, vLLM's default, and 1024), under both metrics — Eq. 4 of HyperFlexis
   (TTFT met and the mean TPOT met) and per-token deadlines (token i by arrival + TTFT + i·TPOT,
   as PolyServe §2.3 scores) — from one set of probe runs: the two searches share every rate
   they both probe.
4. **The table.** Per cell, HFX's capacity over the best tuned peer's, with each one's spread;
   the cell's work bound (hfx/evaluation/bound.py: the most any dispatcher and engine could
   carry) and its blind bound (the same for one that knows no output length before it ends,
   as no contender does), and HFX's share of each; and a note where issue 49's 1.2x goal
   cannot be the dispatcher's to meet: round robin within 3% of the best contender
   (``fleet-bound``), 1.2x the best peer above the work bound (``goal above the bound``), or
   above the blind bound (``goal above the blind bound``: only an output-length oracle could).

Capacity is ``hfx.evaluation.capacity.seed_capacity``'s: steady-state runs, bracketing and
bisection for the highest rate at 90% attainment, and its ``crossing``: the 90% crossing
interpolated between the bracket's ends, which tells apart what the bisection's grid leaves
equal. Tables and tuning rank by the crossing (``resolved``; computed from the probes of a
result written before it was recorded). A probe run ends once it fails under both metrics
(hfx/sim/miss_watch.py; its row says ``stopped_at``), and the failing rate each crossing reads
is run whole: capacities and crossings are whole runs', for a quarter less CPU on the
searches measured (docs/performance.md, "Capacity searches").

With ``engine`` every contender runs on that one engine planner (its own planner's knobs left
out of its grid): dispatchers compared on the same engine, apart from the engines their papers
assume. Every search row names the commit it ran at; a table is rendered from one commit only
(``one_commit``).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import product
from typing import Any

from hfx.config import SimConfig
from hfx.evaluation.capacity import (
    at_rate,
    crossing,
    is_trace,
    measured_bracket,
    quick_probe,
    seed_capacity,
)
from hfx.evaluation.presets import SEED_DISPATCHER
from hfx.evaluation.runner import run_all
from hfx.sim.driver import simulate

METRICS = {"eq4": "attainment", "deadline": "attainment_dslo"}
REGIMES = (256, 1024)  # max_num_seqs: vLLM's default, and a common production setting
WORKLOADS = ("four-task", "two-task", "bursty-four-task", "wikisql", "tiered-512-512",
             "tiered-4096-1024")
SEEDS = (0, 1, 2)
TUNING_WORKLOAD = "six-task"
# A tuning workload held out by task, length and SLO (SLOs-Serve §6's Mixed scenario: its
# ChatBot, Coder and Summarizer): six-task holds the evaluated tasks with their SLOs.
HELD_OUT = "slos-serve-mixed"
TUNING_SEED = 100
TARGET = 0.9
GOAL = 1.2  # issue 49: HFX at 1.2x the best tuned peer
FLEET_BOUND = 0.97  # issue 49: round robin within 3% of the best is a fleet-bound cell
# Steady-state probes: the evaluation's, and the cheaper tuning's (it ranks settings of one
# policy against each other, not policies).
EVALUATION_RUN = {"duration": 150.0, "warmup": 20.0, "tolerance": 0.03}
TUNING_RUN = {"duration": 90.0, "warmup": 20.0, "tolerance": 0.05}
# Tuning's resolution: two tunings of the same code (cold, and warm: compare.py --warm) score
# one setting 0.4% apart at the median, 1.2% at the 95th percentile and 2.1% at most (276
# settings of four tables; bench/sim/tuning_noise.py, docs/data/tuning_noise.json). Settings
# closer than this are a tie.
TUNING_TIE = 0.02
# Where each search starts (requests/s for 2 instances, in proportion for more): near the
# knee, to save probes.
START = {"four-task": 100.0, "two-task": 100.0, "bursty-four-task": 80.0, "wikisql": 8.0,
         "six-task": 60.0, "tiered-512-512": 40.0, "tiered-4096-1024": 4.0,
         HELD_OUT: 8.0}
# Workloads that come with their own fleet: PolyServe's tiered settings (PolyServe §5.1) are
# Llama-3.1-8B on H200, whose ~7 ms decode step makes the 20 ms TPOT tier reachable at all (on
# the 910B profile one decode step takes ~25 ms, so no rate attains 90%).
WORKLOAD_CONFIG: dict[str, dict[str, Any]] = {
    w: {"model": "llama-3.1-8b", "hardware": "h200"}
    for w in ("tiered-512-512", "tiered-4096-1024")}
# The config fields a run's fleet may set for every search (over each workload's own).
FLEET_FIELDS = ("model", "hardware", "instances")


def _grid(**axes: Iterable[Any]) -> tuple[dict[str, Any], ...]:
    """Every combination of the axes' values, as policy parameters (``planner.x`` names a
    planner parameter)."""
    names = list(axes)
    out = []
    for values in product(*axes.values()):
        setting: dict[str, Any] = {}
        for name, value in zip(names, values, strict=True):
            kind, _, key = name.rpartition("__")
            target = "planner_params" if kind == "planner" else "policy_params"
            setting.setdefault(target, {})[key or name] = value
        out.append(setting)
    return tuple(out)


@dataclass(frozen=True)
class Contender:
    """A policy as it competes: the config fields that make it (its engine planner included)
    and the settings of its own knobs that tuning may choose from."""

    name: str
    fields: dict[str, Any]
    grid: tuple[dict[str, Any], ...] = ({},)
    every_regime: bool = True  # the baselines below need only the 256-sequence regime
    help: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not 1 <= len(self.grid) <= 12:
            raise ValueError(f"{self.name}: a tuning grid holds 1 to 12 settings, "
                             f"not {len(self.grid)}")

    def config(self, setting: dict[str, Any], engine: str | None = None,
               **fields: Any) -> SimConfig:
        """The contender's SimConfig under ``setting``, with ``fields`` (workload, seed, …);
        on ``engine``'s planner instead of its own, if given (without its planner's knobs)."""
        merged: dict[str, Any] = {**self.fields, **fields}
        for key in ("policy_params", "planner_params"):
            merged[key] = {**self.fields.get(key, {}), **setting.get(key, {})}
        if engine is not None:
            merged["planner"], merged["planner_params"] = engine, {}
        return SimConfig(**merged)

    def grid_on(self, engine: str | None) -> tuple[dict[str, Any], ...]:
        """The settings tuning chooses from on ``engine`` (None: its own): those that differ
        in more than the planner's knobs, which another engine does not have."""
        if engine is None:
            return self.grid
        out: list[dict[str, Any]] = []
        for setting in self.grid:
            kept = {k: v for k, v in setting.items() if k != "planner_params"}
            if kept not in out:
                out.append(kept)
        return tuple(out)


CONTENDERS: dict[str, Contender] = {c.name: c for c in (
    # Each axis lists its shipped value first (``choose`` keeps it unless another beats it).
    # HyperFlexis §5.1: θ (admit at this probability of a timely first token), and our
    # override's leads; the engine's paced chunks' share of the TTFT slack. (A grid with the
    # engine's prefill_alone in place of the leads chose it off in both regimes:
    # docs/data/compare_prefill_alone_tuning.json.)
    Contender("hfx", {"policy": "hfx"}, _grid(
        theta=(0.9, 0.8), lead_prefills=(5.0, 2.5, 10.0), planner__slack_share=(0.4, 0.25)),
        help="as shipped: deadline-chunked engine, the override on"),
    Contender("hfx-paper", {"policy": "hfx", "planner": "prefill-first",
                            "policy_params": SEED_DISPATCHER},
              _grid(theta=(0.9, 0.7, 0.8, 0.95), prefill_cv=(0.1, 0.05, 0.2)),
              help="HyperFlexis §5.1's dispatcher on the prefill-first engine"),
    # SLOs-Serve §4: how many instances a request may be routed over, and the decode pace (the
    # engine's, which admission plans with too).
    Contender("slos-serve", {"policy": "slos-serve"}, tuple(
        {"policy_params": {"route_limit": r, "pace": p}, "planner_params": {"pace": p}}
        for r in (2, 1, 4) for p in (0.9, 0.7, 0.8, 1.0))),
    # PolyServe §4: the smallest prefill chunk, how many of a tier's requests may fail to
    # place in one call before the rest of the tier waits for the next, and the admission
    # check's KV over a new request's life: §4.5's requests that exit, or our first reading's
    # that all grow through it. (max_misses 4 ranked last in every tuning before it joined.)
    Contender("polyserve", {"policy": "polyserve"}, _grid(
        min_chunk=(64, 32, 128), max_misses=(8, 16), kv_future=("exits", "grow"))),
    # The SA scheduler: batch size and the window of queued requests searched.
    Contender("sa", {"policy": "sa"}, _grid(max_batch=(16, 1, 2, 4), window=(40, 20, 80))),
    Contender("rr", {"policy": "rr"}),
    Contender("scorpio", {"policy": "scorpio"}, _grid(epsilon=(1.1, 1.0, 1.05, 1.2, 1.5)),
              every_regime=False),
    Contender("aladdin", {"policy": "aladdin"}, every_regime=False),
    Contender("least-loaded", {"policy": "least-loaded"}, every_regime=False),
    # The cache-aware routers users put in front of vLLM (docs/peers.md), on vLLM's chunked
    # engine: llm-d's index (its approximate producer, or the precise one from KV events);
    # Dynamo's overlap_score_weight. On work that repeats nothing they balance load only.
    Contender("llm-d", {"policy": "llm-d"}, _grid(index=("approx", "precise")),
              every_regime=False),
    Contender("dynamo", {"policy": "dynamo"}, _grid(overlap_score_weight=(1.0, 0.5, 2.0)),
              every_regime=False),
    Contender("sglang", {"policy": "sglang"}, every_regime=False),
    Contender("prefix-aware", {"policy": "prefix-aware"}, every_regime=False),
)}
HFX = ("hfx", "hfx-paper")

Probe = Callable[[SimConfig], dict]


def dual_capacity(config: SimConfig, target: float = TARGET, tolerance: float = 0.03,
                  probe: Probe = simulate, warm: Mapping[str, float] | None = None) -> dict:
    """``seed_capacity`` under each metric of ``METRICS``, from one set of probe runs: a rate
    the first search probed is not run again for the second, and where the first's probes
    already bracket the second's crossing within ``tolerance`` (``measured_bracket``: the
    two metrics' crossings are often a step apart or less) the second runs none. ``warm``:
    each metric's crossing in an earlier run of the same search; each search that runs then
    starts just below it, its first step within ``tolerance`` (``warm_start``), where it would
    start at the config's rate. The row records each metric's warm start as its input, run
    or not (``{metric}_warm_start``)."""
    seen: dict[float, dict] = {}
    quick = quick_probe(probe, target)  # a run that stops once it fails under both metrics

    def once(c: SimConfig, whole: bool) -> dict:
        rate = c.trace_qps if is_trace(c.workload) and c.trace_qps else c.qps
        r = seen.get(rate)
        if r is None or (whole and r.get("stopped_at") is not None):
            r = seen[rate] = probe(c) if whole else quick(c)
        return r

    t0 = time.perf_counter()
    out: dict[str, Any] = {"seed": config.seed}
    for name, key in METRICS.items():
        start, step = warm_start((warm or {}).get(name), tolerance)
        if start is not None:  # the search's input, whether or not it runs (reproduce.py)
            out[f"{name}_warm_start"] = start
        known = {q: r[key] for q, r in seen.items()}
        bracket = measured_bracket(known, target, tolerance)
        while bracket is not None and seen[bracket[1]].get("stopped_at") is not None:
            # The crossing reads whole runs; a whole run may pass where its quick one stopped.
            known[bracket[1]] = once(at_rate(config, bracket[1]), whole=True)[key]
            bracket = measured_bracket(known, target, tolerance)
        if bracket is not None:
            out[name], out[f"{name}_crossing"] = bracket[0], crossing(known, bracket[0], target)
            continue
        c = config if start is None else at_rate(config, start)
        found = seed_capacity(c, target, tolerance, partial(once, whole=True), key,
                              partial(once, whole=False), step)
        out[name], out[f"{name}_crossing"] = found["capacity"], found["crossing"]
    out["probes"] = [{"qps": q, "attainment": r["attainment"],
                      "attainment_dslo": r["attainment_dslo"], "hit_rate": r.get("hit_rate"),
                      **({} if r.get("stopped_at") is None else {"stopped_at": r["stopped_at"]})}
                     for q, r in sorted(seen.items())]
    out["wall_seconds"] = round(time.perf_counter() - t0, 2)
    return out


def warm_start(earlier: float | None, tolerance: float) -> tuple[float | None, float]:
    """Where a search starts and its first step, given the capacity an earlier run of it found
    (None or 0: cold, at the config's rate, doubling): half a tolerance below it, stepping by
    just under one tolerance, so an unchanged capacity is bracketed by its first two probes."""
    if not earlier or earlier <= 0:
        return None, 2.0
    return round(earlier * (1 - tolerance / 2), 6), 1 + 0.99 * tolerance


def resolved(row: dict, metric: str, target: float = TARGET) -> float:
    """A search's capacity under ``metric`` as tables and tuning rank it: its 90% crossing
    (``hfx.evaluation.capacity.crossing``), from its probes where the row predates it."""
    if f"{metric}_crossing" in row:
        return float(row[f"{metric}_crossing"])
    key = METRICS[metric]
    scores = {p["qps"]: p[key] for p in row.get("probes", [])}
    return crossing(scores, row[metric], target)


def one_commit(rows: Sequence[dict]) -> str:
    """The commit every search ran at; a ValueError naming each commit's contenders where
    they differ or are not recorded (a table must not mix cells of different code
    unnoticed)."""
    by_commit: dict[str, set[str]] = {}
    for r in rows:
        by_commit.setdefault(r.get("commit", "not recorded"), set()).add(r["contender"])
    if len(by_commit) == 1 and "not recorded" not in by_commit:
        return next(iter(by_commit))
    raise ValueError("the searches ran at different commits: " + "; ".join(
        f"{c}: {', '.join(sorted(names))}" for c, names in sorted(by_commit.items())))


def start(workload: str, fields: Mapping[str, Any]) -> float:
    """The rate a search on ``workload`` starts at, for the fleet ``fields`` name."""
    return START.get(workload, 20.0) * fields.get("instances", 2) / 2


def _search(name: str, setting: dict[str, Any], run: dict[str, float], fields: dict[str, Any],
            probe: Probe = simulate, engine: str | None = None,
            warm: Mapping[str, float] | None = None) -> dict:
    workload = fields["workload"]
    # ``fields`` (a fleet given for the whole run among them) over the workload's own fleet.
    merged = {**WORKLOAD_CONFIG.get(workload, {}), **fields}
    config = CONTENDERS[name].config(setting, engine, qps=start(workload, merged),
                                     duration=run["duration"], warmup=run["warmup"], **merged)
    return dual_capacity(config, TARGET, run["tolerance"], probe, warm)


def geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if min(values) > 0 else 0.0


def regimes_of(name: str, regimes: Sequence[int]) -> list[int]:
    return list(regimes) if CONTENDERS[name].every_regime else [min(regimes)]


def _setting_key(setting: Mapping[str, Any]) -> str:
    return json.dumps(setting, sort_keys=True)


def _capacities(row: dict) -> dict[str, float]:
    return {m: resolved(row, m) for m in METRICS}


def earlier_tuning(result: Mapping[str, Any] | None) -> dict[tuple[str, int, str], dict]:
    """An earlier result's tuning searches' capacities by metric, keyed (contender, regime,
    setting): where ``tune`` starts the same searches (``warm_start``)."""
    out = {}
    for n, by_regime in (result or {}).get("tuning", {}).items():
        for regime, t in by_regime.items():
            for setting, row in zip(t.get("settings", ()), t.get("results", ()), strict=False):
                out[(n, int(regime), _setting_key(setting))] = _capacities(row)
    return out


def earlier_searches(result: Mapping[str, Any] | None,
                     instances: int = 2) -> dict[tuple[str, str, int, int], dict]:
    """An earlier result's evaluation searches' capacities by metric, keyed (contender,
    workload, seed, regime): where ``evaluate`` starts the same searches, on ``instances``
    (an earlier fleet of another size in proportion: a guess the search corrects)."""
    out = {}
    for r in (result or {}).get("searches", ()):
        scale = instances / r.get("instances", 2)
        out[(r["contender"], r["workload"], r["seed"], r["regime"])] = {
            m: c * scale for m, c in _capacities(r).items()}
    return out


def tune(names: Sequence[str], regimes: Sequence[int] = REGIMES, jobs: int | None = None,
         ray_address: str | None = None, probe: Probe = simulate,
         progress: bool = True, engine: str | None = None,
         fleet: dict[str, Any] | None = None,
         earlier: Mapping[str, Any] | None = None,
         workload: str = TUNING_WORKLOAD) -> dict[str, dict[str, dict]]:
    """Each contender's capacity per grid setting on the tuning workload and seed, per regime,
    and the setting chosen: {name: {regime: {"settings", "capacities", "chosen"}}}. ``fleet``:
    config fields (``FLEET_FIELDS``) for every run, over each workload's own. ``earlier``: a
    result of the same protocol whose searches start these (``warm_start``). ``workload``:
    ``HELD_OUT`` tunes on tasks, lengths and SLOs that no evaluated workload has."""
    # A tuning on another workload is no guide to where this one's searches end.
    same = (earlier or {}).get("protocol", {}).get("tuning_workload", TUNING_WORKLOAD) == workload
    warm = earlier_tuning(earlier if same else None)
    calls = [(n, setting, TUNING_RUN, {"workload": workload, "seed": TUNING_SEED,
                                       "max_num_seqs": regime, **(fleet or {})}, probe, engine,
              warm.get((n, regime, _setting_key(setting))))
             for n in names for regime in regimes_of(n, regimes)
             for setting in CONTENDERS[n].grid_on(engine)]
    found = iter(run_all(_search, calls, jobs, ray_address, progress, "tuning"))
    out: dict[str, dict[str, dict]] = {}
    for n in names:
        for regime in regimes_of(n, regimes):
            grid = CONTENDERS[n].grid_on(engine)
            results = [next(found) for _ in grid]
            scores = [geomean([resolved(r, m) for m in METRICS]) for r in results]
            best = choose(scores)
            out.setdefault(n, {})[str(regime)] = {
                "settings": list(grid), "results": results, "scores": scores,
                "chosen": grid[best]}
    return out


def choose(scores: Sequence[float], tie: float = TUNING_TIE) -> int:
    """The index of the setting tuning keeps: the first listed whose score is within ``tie``
    of the best (a shipped setting, listed first, loses only to one that beats it beyond the
    tuning's resolution)."""
    top = max(scores)
    return next(i for i, s in enumerate(scores) if s * (1 + tie) >= top)


def evaluate(tuned: dict[str, dict[str, dict]], workloads: Sequence[str] = WORKLOADS,
             seeds: Sequence[int] = SEEDS, regimes: Sequence[int] = REGIMES,
             jobs: int | None = None, ray_address: str | None = None,
             probe: Probe = simulate, progress: bool = True,
             engine: str | None = None, fleet: dict[str, Any] | None = None,
             earlier: Mapping[str, Any] | None = None) -> list[dict]:
    """Every tuned contender's dual capacity per workload × seed × regime: one row each,
    naming the commit it ran at (and ``fleet``, as ``tune`` takes it, where given).
    ``earlier``: a result of the same protocol whose searches start these (``warm_start``)."""
    from hfx.evaluation import code_commit

    commit = code_commit()
    fleet = fleet or {}
    warm = earlier_searches(earlier, fleet.get("instances", 2))
    keys = [(n, w, s, regime) for n in tuned for w in workloads
            for regime in regimes_of(n, regimes) for s in seeds]
    calls = [(n, tuned[n][str(regime)]["chosen"], EVALUATION_RUN,
              {"workload": w, "seed": s, "max_num_seqs": regime, **fleet}, probe, engine,
              warm.get((n, w, s, regime))) for n, w, s, regime in keys]
    results = run_all(_search, calls, jobs, ray_address, progress, "evaluation")
    return [{"contender": n, "workload": w, "seed": s, "regime": regime, "commit": commit,
             **fleet, **r} for (n, w, s, regime), r in zip(keys, results, strict=True)]


@dataclass(frozen=True, slots=True)
class CellBound:
    """A cell's bounds (hfx/evaluation/bound.py), requests/s at ``TARGET``."""

    work: float  # knowing every request's output length
    blind: float | None  # knowing none before it ends (None: no blind bound for the workload)


def cell_bounds(rows: Sequence[dict]) -> dict[tuple[str, int], CellBound]:
    """Each workload × regime's work and blind bounds (hfx/evaluation/bound.py) at
    ``TARGET``: the means over the seeds its searches ran, on the fleet they ran on."""
    from hfx.evaluation.bound import config_bounds

    seeds: dict[tuple[str, int], set[int]] = {}
    fleets: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["workload"], r["regime"])
        seeds.setdefault(key, set()).add(r["seed"])
        fleets[key] = {k: r[k] for k in FLEET_FIELDS if k in r}
    out = {}
    for (workload, regime), ss in seeds.items():
        fields = {**WORKLOAD_CONFIG.get(workload, {}), **fleets[(workload, regime)]}
        pairs = [config_bounds(SimConfig(workload=workload, qps=start(workload, fields), seed=s,
                                         max_num_seqs=regime,
                                         duration=EVALUATION_RUN["duration"], **fields), TARGET)
                 for s in sorted(ss)]
        blinds = [b.qps for _, b in pairs if b is not None]
        out[(workload, regime)] = CellBound(statistics.fmean(w.qps for w, _ in pairs),
                                            statistics.fmean(blinds) if blinds else None)
    return out


def cells(rows: Sequence[dict],
          bounds: Mapping[tuple[str, int], CellBound] | None = None) -> list[dict]:
    """Per workload × regime × metric: each contender's mean and spread over seeds, the best
    peer (not HFX), and each HFX variant's ratio to it; round robin's share of the best
    contender; with ``bounds`` (``cell_bounds``), the work and blind bounds and HFX's share
    of each; and the note of a cell whose goal is not the dispatcher's to meet."""
    out = []
    groups: dict[tuple[str, int], dict[str, list[dict]]] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["regime"]), {}).setdefault(
            r["contender"], []).append(r)
    for (workload, regime), by_name in groups.items():
        for metric in METRICS:
            stats: dict[str, dict[str, Any]] = {}
            for n, rs in by_name.items():
                values = [resolved(x, metric) for x in sorted(rs, key=lambda x: x["seed"])]
                stats[n] = {"mean": statistics.fmean(values),
                            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                            "per_seed": values}
            peers = {n: v for n, v in stats.items() if n not in HFX}
            best = max(peers, key=lambda n: peers[n]["mean"]) if peers else None
            cell: dict[str, Any] = {"workload": workload, "regime": regime, "metric": metric,
                                    "capacities": stats, "best_peer": best}
            for h in HFX:
                if h in stats and best is not None and peers[best]["mean"] > 0:
                    cell[f"{h}_over_best_peer"] = stats[h]["mean"] / peers[best]["mean"]
            top = max(v["mean"] for v in stats.values())
            if "rr" in stats and top > 0:
                cell["rr_share"] = stats["rr"]["mean"] / top
            notes = []
            if cell.get("rr_share", 0.0) >= FLEET_BOUND:
                notes.append("fleet-bound")
            bound = (bounds or {}).get((workload, regime))
            if bound is not None:
                cell["bound"], cell["blind_bound"] = bound.work, bound.blind
                if "hfx" in stats:
                    cell["hfx_over_bound"] = stats["hfx"]["mean"] / bound.work
                    if bound.blind is not None:
                        cell["hfx_over_blind"] = stats["hfx"]["mean"] / bound.blind
                goal = GOAL * peers[best]["mean"] if best is not None else 0.0
                if goal > bound.work:
                    notes.append("goal above the bound")
                elif bound.blind is not None and goal > bound.blind:
                    notes.append("goal above the blind bound")
            cell["note"] = ", ".join(notes)
            out.append(cell)
    return out


def headline(table: Sequence[dict]) -> str:
    """The markdown table docs/results.md leads with."""
    lines = ["| workload | max seqs | metric | hfx | hfx (paper) | best tuned peer | "
             "hfx / peer | paper / peer | work / blind bound | hfx / bounds | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cap(c: dict, n: str | None) -> str:
        if n is None or n not in c["capacities"]:
            return "–"
        v = c["capacities"][n]
        return f"{v['mean']:.1f} ± {v['std']:.1f}"

    def ratio(x: float | None) -> str:
        return "–" if x is None else f"**{x:.2f}×**" if x >= 1.2 else f"{x:.2f}×"

    for c in table:
        if "hfx_over_bound" not in c:
            bound = "– | –"
        elif c.get("blind_bound") is None:
            bound = f"{c['bound']:.1f} / – | {c['hfx_over_bound']:.0%} / –"
        else:
            bound = (f"{c['bound']:.1f} / {c['blind_bound']:.1f} | {c['hfx_over_bound']:.0%} / "
                     f"{c['hfx_over_blind']:.0%}")
        lines.append(
            f"| {c['workload']} | {c['regime']} | {c['metric']} | {cap(c, 'hfx')} | "
            f"{cap(c, 'hfx-paper')} | {c['best_peer']} {cap(c, c['best_peer'])} | "
            f"{ratio(c.get('hfx_over_best_peer'))} | {ratio(c.get('hfx-paper_over_best_peer'))} | "
            f"{bound} | {c.get('note', '')} |")
    return "\n".join(lines)
