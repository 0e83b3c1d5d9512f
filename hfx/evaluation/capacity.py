"""Capacity as users mean it: the highest QPS a fleet sustains at a target attainment.

Each probe is a steady-state run (``--duration`` of Poisson arrivals, ``--warmup`` left out,
a bounded drain whose leftovers count as missed), so a rate the fleet cannot keep up with shows
as a growing backlog, not as a queue that drains after the trace ends. Per seed, the rate is
bracketed (doubling or halving from ``--qps``) and then bisected until the bracket is within
``tolerance`` (relative); the capacity is the bracket's low end, the highest rate measured to
meet the target, and the ``crossing`` the rate where the attainment measured at the bracket's
ends crosses the target, interpolated linearly between them: finer than the bracket, so two
policies (or two settings) that the bisection leaves on one grid point are still told apart.
Seeds run in parallel processes; the result gives each seed's capacity, its probes, and the
mean and spread.

On a trace file the rate searched is the trace's own, rescaled (``--trace-qps``: its arrivals
compressed or stretched, its requests as they are), so the answer is the rate of *that*
traffic the fleet carries; the run is the trace, start to end, and ``--warmup`` (0 unless
given) leaves its first seconds out of the score.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial

from hfx.config import SimConfig
from hfx.evaluation.runner import run_all
from hfx.sim.driver import resolve_profile, simulate
from hfx.workloads.kinds import workload_tasks
from hfx.workloads.tasks import TIERED, TIERS, TTFTS

DEFAULT_DURATION = 300.0  # seconds of arrivals per probe, when the config gives none
DEFAULT_WARMUP = 60.0
MAX_DOUBLINGS = 12  # 4096× the first guess: far past any fleet we simulate

Probe = Callable[[SimConfig], dict]


def is_trace(workload: str) -> bool:
    return workload.endswith((".jsonl", ".csv"))


def rate_of(config: SimConfig) -> float:
    """The rate a capacity search varies: the trace's (``trace_qps``, its own mean rate
    unless given) or the workload's ``qps``."""
    if not is_trace(config.workload):
        return config.qps
    if config.trace_qps is not None:
        return config.trace_qps
    from hfx.sim.driver import load_requests

    requests = load_requests(config)
    span = requests[-1].arrival - requests[0].arrival if len(requests) > 1 else 0.0
    if span <= 0:
        raise ValueError(f"{config.workload}: a trace needs arrivals over time to be "
                         "rescaled; give --trace-qps")
    return len(requests) / span  # as read_trace's target_qps counts it


def at_rate(config: SimConfig, qps: float) -> SimConfig:
    """``config`` at rate ``qps`` (of the trace, for a trace file: ``rate_of``)."""
    return config.model_copy(update={"trace_qps" if is_trace(config.workload) else "qps": qps})


def steady(config: SimConfig) -> SimConfig:
    """``config`` as a steady-state run: the defaults above unless it sets its own. A trace
    runs as it is (rescaled): its arrivals end where it ends."""
    if config.duration is not None or is_trace(config.workload):
        return config
    return config.model_copy(update={"duration": DEFAULT_DURATION, "warmup": DEFAULT_WARMUP})


def _probe_row(r: dict, qps: float) -> dict:
    row = {"qps": qps, "attainment": r["attainment"], "hit_rate": r.get("hit_rate"),
           "attainment_dslo": r.get("attainment_dslo"), "shed": r["shed"],
           "backlog_at_end": r["backlog_at_end"], "max_wait": r["max_wait"],
           "requests": r["requests"]}
    if r.get("stopped_at") is not None:  # a truncated run's attainments: below the target
        row["stopped_at"] = r["stopped_at"]
    return row


def quick_probe(probe: Probe, target: float) -> Probe:
    """``probe`` ending each run once it cannot reach ``target`` (hfx/sim/miss_watch.py):
    the search asks of a rate above the capacity only that it fails. Another probe (a test's,
    a real fleet's) runs as it is."""
    if probe is simulate:
        return partial(simulate, stop_below=target)
    return probe


def slo_classes(workload: str) -> list[tuple[float, float, float, float, float]]:
    """(share of requests, TTFT, TPOT, typical prompt, typical output) of each SLO class a
    workload draws from; none for a trace file."""
    if is_trace(workload):
        return []
    if workload in TIERED:  # PolyServe §5.1: tier and TTFT drawn independently
        prompt, output = TIERED[workload]
        return [(share / len(TTFTS), ttft, tpot, prompt, output)
                for tpot, share in TIERS for ttft in TTFTS]
    tasks = workload_tasks(workload)
    return [(1 / len(tasks), t.slo.ttft, t.slo.tpot, t.input_mean, t.output_mean)
            for t in tasks]


def unreachable(config: SimConfig) -> tuple[float, list[str]]:
    """The share of a workload's requests that miss their SLO even alone on an idle instance
    of the config's profile (the prompt's prefill exceeds the TTFT, or one decode step the
    TPOT), and why; (0, []) for a trace file or priorities (mapped SLOs)."""
    if config.priorities:
        return 0.0, []
    model = resolve_profile(config).model
    lost, why = 0.0, []
    for share, ttft, tpot, prompt, output in slo_classes(config.workload):
        prefill = model.prefill_one(round(prompt))
        step = model.decode_time(prompt + output / 2, 1)
        if prefill > ttft or step > tpot:
            lost += share
            why.append(f"TTFT {ttft * 1e3:g} ms / TPOT {tpot * 1e3:g} ms ({share:.0%} of "
                       f"requests): alone, prefill {prefill * 1e3:.1f} ms, decode step "
                       f"{step * 1e3:.1f} ms")
    return lost, why


def seed_capacity(config: SimConfig, target: float = 0.9, tolerance: float = 0.02,
                  probe: Probe = simulate, metric: str = "attainment",
                  quick: Probe | None = None, first_step: float = 2.0) -> dict:
    """The highest rate meeting ``target`` attainment for ``config``'s seed, by bracketing then
    bisection; with every probe run. ``metric``: the result's attainment to score, Eq. 4's
    (``attainment``) or per-token deadlines (``attainment_dslo``). The search runs ``quick``
    (default ``quick_probe(probe, target)``), whose runs may end once they fail; the one
    failing rate the ``crossing`` reads is then run whole with ``probe``, so capacity and
    crossing are those of whole runs.

    The bracket steps from the config's rate by ``first_step``, each step the square of the
    last up to 2 (doubling throughout by default): a search started just below a capacity
    known from an earlier run, with a first step within ``tolerance``, is bracketed in two
    probes where doubling takes six or seven."""
    if not 0 < target <= 1:
        raise ValueError(f"target attainment must be in (0, 1], got {target}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    if not 1 < first_step <= 2:
        raise ValueError(f"first_step must be in (1, 2], got {first_step}")
    lost, why = unreachable(config)
    if lost >= 1 - target - 1e-9:  # the search would halve towards 0 QPS, probe after probe
        raise ValueError(
            f"{lost:.0%} of {config.workload}'s requests miss their SLO even alone on an idle "
            f"instance of {config.profile or f'{config.model}@{config.hardware}'}, so no rate "
            f"attains {target:.0%}: " + "; ".join(why)
            + ". Choose a faster profile (--model/--hardware) or a lower --target")
    probes: list[dict] = []
    scores: dict[float, float] = {}
    stopped: set[float] = set()
    run = quick_probe(probe, target) if quick is None else quick

    def meets(qps: float) -> bool:
        r = run(at_rate(config, qps))
        probes.append(_probe_row(r, qps))
        scores[qps] = r[metric]
        if r.get("stopped_at") is not None:
            stopped.add(qps)
        return r[metric] >= target

    q = rate_of(config)
    lo: float | None
    hi: float | None
    step = first_step
    if meets(q):
        lo, hi = q, None
        for _ in range(MAX_DOUBLINGS):
            q *= step
            step = min(step * step, 2.0)
            if not meets(q):
                hi = q
                break
            lo = q
        if hi is None:
            raise ValueError(f"attainment stays above {target} up to {lo:g} QPS: give a "
                             "higher --qps to start from")
    else:
        lo, hi = None, q
        for _ in range(MAX_DOUBLINGS):
            q /= step
            step = min(step * step, 2.0)
            if meets(q):
                lo = q
                break
            hi = q
        if lo is None:
            return {"seed": config.seed, "capacity": 0.0, "crossing": 0.0, "probes": probes}
    while (hi - lo) / lo > tolerance:
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    # The crossing reads the least failing rate's attainment: a whole run's.
    above = min((q for q, s in scores.items() if q > lo and s < target), default=None)
    if above is not None and above in stopped:
        r = probe(at_rate(config, above))
        scores[above] = r[metric]
        probes.append(_probe_row(r, above))
    return {"seed": config.seed, "capacity": lo, "crossing": crossing(scores, lo, target),
            "probes": probes}


def measured_bracket(scores: dict[float, float], target: float,
                     tolerance: float) -> tuple[float, float] | None:
    """The bracket a search would end on, where rates already measured give it: the highest
    rate meeting ``target`` and the least above it measured not to, within ``tolerance`` of
    each other, with no rate between them; None where the measurements give none."""
    lo = max((q for q, s in scores.items() if s >= target), default=None)
    if lo is None:
        return None
    hi = min((q for q in scores if q > lo), default=None)
    if hi is None or (hi - lo) / lo > tolerance:
        return None
    return lo, hi


def crossing(scores: dict[float, float], capacity: float, target: float) -> float:
    """Where the attainment crosses ``target`` between ``capacity`` (the highest rate the
    search found meeting it) and the least rate above it measured not to: linear between the
    two measurements. ``capacity`` itself when nothing above it was measured to fail, or it is
    0 (no rate met the target)."""
    if capacity <= 0 or capacity not in scores:
        return capacity
    above = [q for q, s in scores.items() if q > capacity and s < target]
    if not above:
        return capacity
    hi = min(above)
    s_lo, s_hi = scores[capacity], scores[hi]
    if s_lo <= s_hi:
        return capacity
    return capacity + (hi - capacity) * min(1.0, (s_lo - target) / (s_lo - s_hi))


def over_seeds(per_seed: list[dict]) -> dict:
    """Mean and standard deviation of ``seed_capacity`` results, and each in seed order."""
    values = [r["capacity"] for r in sorted(per_seed, key=lambda r: r["seed"])]
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "per_seed": values}


def capacity(config: SimConfig, seeds: int = 3, target: float = 0.9, tolerance: float = 0.02,
             jobs: int | None = None, ray_address: str | None = None) -> dict:
    """``seed_capacity`` for seeds ``config.seed`` … ``config.seed + seeds − 1`` (in parallel:
    ``jobs`` processes, or the Ray cluster at ``ray_address``), and their mean and spread, in
    requests/s for the whole fleet and per instance; and, for a fixed colocated fleet, the
    work bound (hfx/evaluation/bound.py): the most any policy could carry there, and the blind
    bound: the most one that does not know output lengths could."""
    config = steady(config)
    configs = [config.model_copy(update={"seed": config.seed + i}) for i in range(seeds)]
    per_seed = run_all(seed_capacity, [(c, target, tolerance) for c in configs], jobs,
                       ray_address, progress=False, desc="capacity")
    over = over_seeds(per_seed)
    instances = config.max_instances or config.initial_instances
    bound = blind = None
    if config.mode == "colocated" and config.max_instances is None:
        from hfx.evaluation.bound import config_bounds

        work, blind_bound = config_bounds(config, target)
        bound = work.to_json()
        blind = blind_bound.to_json() if blind_bound is not None else None
    return {
        "policy": config.policy, "workload": config.workload, "mode": config.mode,
        "instances": instances, "target": target, "tolerance": tolerance,
        "duration": config.duration, "warmup": config.warmup, "drain": config.drain_seconds,
        "capacity_mean": over["mean"], "capacity_std": over["std"],
        "capacity_min": min(over["per_seed"]), "capacity_max": max(over["per_seed"]),
        "per_instance_mean": over["mean"] / instances,
        "work_bound": bound,
        "blind_bound": blind,
        "seeds": per_seed,
        "config": config.model_dump(),
    }
