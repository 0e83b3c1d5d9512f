"""Simulate a cluster: the serving code on the virtual-time loop with SimExecutors.

``simulate(config)`` returns the result object of DESIGN.md "Contracts". The run is
deterministic for a config: the same seed gives the same JSON, except ``wall_seconds``.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import cast

import numpy as np
from tqdm import tqdm

from hfx.assembly import build_cluster, sim_engines
from hfx.backends.local import LocalInstance, LocalPlacement
from hfx.cluster.control import ControlPlane, ScalerHooks
from hfx.cluster.placement import EngineFactory
from hfx.config import SimConfig
from hfx.engine import Role
from hfx.records.columns import FoldFinished, RecordFold, count_outcome
from hfx.records.metrics import distribution, longest_wait, summarize_columns
from hfx.records.streaming import StreamingFold
from hfx.request import Outcome, Request
from hfx.sim.clock import VirtualTimeLoop, run
from hfx.sim.miss_watch import UNTIL_SHARE, MissWatch
from hfx.stepmodel.latency import Profile, load_profile
from hfx.workloads.arrivals import Arrivals
from hfx.workloads.kinds import load_workload, workload_tasks
from hfx.workloads.load import RequestStream, priority_levels, stream, with_priorities
from hfx.workloads.tasks import WORKLOADS


def resolve_profile(config: SimConfig) -> Profile:
    profile = load_profile(config.profile or f"{config.model}@{config.hardware}")
    if config.block_size != profile.block_size:
        profile = replace(profile, block_size=config.block_size)
    return profile


STALL_SECONDS = 600.0  # plus the arrival span: far beyond any workload's drain time


def load_requests(config: SimConfig) -> Sequence[Request]:
    """The config's workload; with priorities, tasks carry a priority instead of an SLO. A task
    set comes as a ``RequestStream``: each request built when the run reaches it."""
    requests: Sequence[Request]
    if config.workload in WORKLOADS:
        requests = stream(config.workload, config.qps, config.seed, config.requests_per_task,
                          config.duration)
    else:
        requests = load_workload(config.workload, config.qps, config.seed,
                                 config.requests_per_task, config.duration, config.trace_format,
                                 config.slo_map, config.time_scale, config.trace_qps)
    if config.priorities and not config.workload.endswith((".jsonl", ".csv")):
        of_task, _ = priority_levels(workload_tasks(config.workload), config.priorities)
        requests = (requests.with_priorities(of_task) if isinstance(requests, RequestStream)
                    else with_priorities(list(requests), of_task))
    return requests


def sim_cluster(config: SimConfig, profile: Profile,
                make_engine: EngineFactory | None = None) -> ControlPlane:
    """``hfx.assembly.build_cluster`` for a simulated run: priorities map onto the workload's
    tasks, the workload's seed drives the provisioner, and simulated outputs reach the control
    plane after the token delivery latency (``--token-delivery``, or the profile's)."""
    delivery = config.token_delivery
    if delivery is None:  # a real engine given here has a delivery of its own
        delivery = 0.0 if make_engine else float(profile.meta.get("token_delivery_seconds", 0))
    make_engine = make_engine or sim_engines(profile, config.step_noise, config.seed)
    return build_cluster(config, profile, placement=LocalPlacement(make_engine, delivery),
                         tasks=workload_tasks(config.workload), seed=config.seed)


async def drive(control: ControlPlane, requests: Sequence[Request], progress: str | None = None,
                until: float | None = None, stop: asyncio.Event | None = None) -> float:
    """Start ``control``, submit ``requests`` at their arrival times, wait until every one has
    an outcome — or, with ``until``, no later than that (requests still pending then stay
    pending: a steady-state run's backlog), or until ``stop`` is set (the requests not yet
    arrived then never arrive) — stop; returns the time it stopped. ``progress`` labels a bar.

    Arrival times count from the start of the run: on the virtual loop that is time 0; on the
    ordinary loop (a real engine) they are shifted to the loop's clock, and so is the result;
    each request's arrival is then the moment it is submitted (timers fire up to ~1 ms late).
    """
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await control.start()
    if control.scaler is not None:
        control.scaler.start()
    bar = tqdm(total=len(requests), desc=progress, unit="req",
               disable=progress is None or None, leave=False)

    async def show_progress() -> None:
        while True:
            await asyncio.sleep(1.0)
            bar.update(control.num_done - bar.n)

    ticker = loop.create_task(show_progress()) if progress else None
    if stop is None:
        await _serve(control, requests, until, loop, t0)
    else:
        serving = loop.create_task(_serve(control, requests, until, loop, t0))
        stopped = loop.create_task(stop.wait())
        await asyncio.wait((serving, stopped), return_when=asyncio.FIRST_COMPLETED)
        for task in (serving, stopped):
            task.cancel()
        await asyncio.gather(serving, stopped, return_exceptions=True)
        if serving.done() and not serving.cancelled() and serving.exception() is not None:
            raise cast(BaseException, serving.exception())
    end = loop.time() - t0
    if ticker is not None:
        ticker.cancel()
    bar.close()
    await control.stop()
    return end


async def _serve(control: ControlPlane, requests: Sequence[Request], until: float | None,
                 loop: asyncio.AbstractEventLoop, t0: float) -> None:
    """``drive``'s run: every arrival, then the wait for the last outcome (or ``until``)."""
    if isinstance(loop, VirtualTimeLoop) and not t0:
        await _arrive(control, requests)
    else:
        for req in requests:
            delay = t0 + req.arrival - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if t0:  # real clock: latency counts from receipt, as a server stamps it, not
                req = replace(req, arrival=loop.time())  # from when a late timer meant to send it
            control.submit(req)
    try:
        # A stalled engine would otherwise keep the Monitor ticking forever on a virtual clock.
        limit = STALL_SECONDS + last_arrival(requests)
        if until is not None:
            limit = max(0.0, until - (loop.time() - t0))
        await asyncio.wait_for(control.wait_idle(), timeout=limit)
    except asyncio.TimeoutError:
        if until is None:
            stuck = sum(r.outcome is Outcome.PENDING for r in control.records.values())
            raise RuntimeError(f"{stuck} requests still unfinished {limit:g} s after the last "
                               "arrival: the cluster stalled") from None


def last_arrival(requests: Sequence[Request]) -> float:
    """The latest arrival (0 if none); a stream's without drawing it to its end."""
    if isinstance(requests, RequestStream):
        return requests.last_arrival
    return requests[-1].arrival if requests else 0.0


async def _arrive(control: ControlPlane, requests: Sequence[Request]) -> None:
    """On the virtual clock from 0: each request submitted by a timer at its arrival time
    (``Arrivals``, compiled); returns when all are in."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    # A stream's own reader: no Python frame per request.
    read = requests.rows.request if isinstance(requests, RequestStream) else requests.__getitem__
    Arrivals(loop, control.submit, read, len(requests), done).start()
    await done


async def run_cluster(config: SimConfig, requests: Sequence[Request], profile: Profile,
                      progress: bool = False, make_engine: EngineFactory | None = None,
                      fold: RecordFold | StreamingFold | None = None,
                      watch: MissWatch | None = None) -> tuple[ControlPlane, float]:
    """Drive ``requests`` through a fresh cluster on the running loop; returns the control plane
    (its records hold the outcome) and the time the last request finished. With ``fold``, each
    finished record goes into it and out of the records (colocated mode only); with ``watch``,
    the run ends once the watch finds its target attainment out of reach."""
    control = sim_cluster(config, profile, make_engine)
    folder = None
    if fold is not None:
        if config.mode != "colocated":
            raise ValueError("folding records needs colocated mode: P/D reads a record after "
                             "its end")
        folder = control.ledger.on_done = FoldFinished(fold.rows, fold.fold_rows, control.forget)
    label = f"{config.policy}@{config.qps:g}qps" if progress else None
    drain = config.drain_seconds
    until = None
    if drain is not None:
        until = (config.duration or last_arrival(requests)) + drain
    if watch is None:
        end = await drive(control, requests, label, until)
    else:
        stop = watch.attach(control)
        looking = asyncio.get_running_loop().create_task(watch.run())
        end = await drive(control, requests, label, until, stop)
        looking.cancel()
    if folder is not None:
        folder.flush()
    return control, end


@contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """A run creates millions of small, mostly acyclic objects (records, token times); the
    default gen-0 threshold of 700 makes the cyclic collector walk them over and over.
    Measured: -18% wall on a 60k-request run (docs/performance.md)."""
    old = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def instance_spans(control: ControlPlane) -> list[tuple[float, float]]:
    """(provisioned, released) of every instance the run had, for cost (seed Eq. 3)."""
    return control.fleet.spans()


def scaling_summary(scaler: ScalerHooks) -> dict:
    return {
        "instances_max_used": scaler.state.max_used,
        "scale_events": [asdict(e) for e in scaler.state.events],
        "instances_over_time": scaler.state.over_time,
    }


def pd_summary(control: ControlPlane) -> dict:
    """Migration figures of a P/D run: how many, and the delay from first token to KV arrival."""
    records = [r for r in control.records.values() if r.migrated_at is not None]
    delays = [r.migrated_at - r.first_token_time for r in records
              if r.migrated_at is not None and r.first_token_time]
    assert control.tl is not None
    return {"prefill_instances": sum(i.role is Role.PREFILL for i in control.instances.values()),
            "migrations": len(records), "migration_delay": distribution(delays),
            "kv_bytes_moved": sum(link.bytes_moved for link in control.tl.links.values())}


def prefix_cache_summary(control: ControlPlane, enabled: bool) -> dict:
    """Each instance's prefix cache over the whole run, warm-up included, as vLLM counts it:
    prompt tokens its first admissions asked for, those found cached, units evicted."""
    per = {}
    for iid, inst in sorted({**control.retired, **control.instances}.items()):
        kv = cast(LocalInstance, inst).engine.kv
        per[str(iid)] = {"queried_tokens": kv.queried_tokens, "hit_tokens": kv.hit_tokens,
                         "hit_rate": kv.hit_tokens / kv.queried_tokens if kv.queried_tokens
                         else 0.0, "evicted_units": kv.evicted_units}
    return {"prefix_caching": enabled, "per_instance_cache": per}


def steady_state_summary(config: SimConfig, backlog: int, max_wait: float) -> dict:
    """What a run that stops on time leaves behind: ``backlog_at_end`` (requests still pending
    when it stopped), ``max_wait`` (``longest_wait``), and the window scored."""
    return {"window": [config.warmup, config.duration] if config.duration else None,
            "drain": config.drain_seconds,
            "backlog_at_end": backlog,
            "max_wait": max_wait}


def simulate(config: SimConfig, progress: bool = False, stop_below: float | None = None
             ) -> dict:
    """Run one simulated configuration; the result object of DESIGN.md "Contracts". With
    ``stop_below``, the run ends once neither attainment can reach it (``MissWatch``), and
    the result's ``stopped_at`` says when (None: it ran to its end); a stopped run's
    attainments are the truncated run's."""
    wall0 = time.perf_counter()
    profile = resolve_profile(config)
    requests = load_requests(config)
    streaming = config.metrics == "streaming"
    fold: RecordFold | StreamingFold = StreamingFold(config.warmup) if streaming else RecordFold()
    watch = None
    if stop_below is not None:
        window = (config.duration or last_arrival(requests)) - config.warmup
        watch = MissWatch(len(requests), stop_below, config.warmup,
                          config.warmup + UNTIL_SHARE * window)
    with _fewer_gc_passes():
        control, end = run(run_cluster(
            config, requests, profile, progress,
            fold=fold if (config.fold_records or streaming) and config.mode == "colocated"
            else None, watch=watch), virtual=True)
    spans = instance_spans(control)
    if isinstance(fold, StreamingFold):
        fold.add(list(control.records.values()), end)  # the records left, pending ones too
        metrics = fold.summary(spans)
        backlog, max_wait = fold.backlog, fold.max_wait
    else:
        measured = fold.columns(list(control.records.values()))  # folded, kept: opening order
        backlog = count_outcome(measured.outcome, Outcome.PENDING)
        # A steady-state run scores the arrivals after the warm-up; a request still pending
        # when the run stops is a miss.
        measured.keep(np.flatnonzero(measured.arrival >= config.warmup))
        metrics = summarize_columns(measured, fold.task_names(), spans)
        max_wait = longest_wait(measured, end)
    result = {
        "policy": config.policy,
        "workload": config.workload,
        "mode": config.mode,
        "qps": config.qps,
        "seed": config.seed,
        "instances": len(control.fleet.active_since) if control.scaler is None
        else len(control.instances) + len(control.retired),
        "profile": profile.name,
        **metrics,
        **steady_state_summary(config, backlog, max_wait),
        "sim_seconds": end,
        "engine_steps": sum(cast(LocalInstance, inst).engine.num_steps for inst in
                            [*control.instances.values(), *control.retired.values()]),
        **(scaling_summary(control.scaler) if control.scaler is not None else {}),
        **(pd_summary(control) if config.mode == "pd" else {}),
        **prefix_cache_summary(control, config.prefix_caching),
        "config": config.model_dump(),
        **({} if watch is None else {"stopped_at": watch.stopped_at}),
        "wall_seconds": time.perf_counter() - wall0,
    }
    return result
