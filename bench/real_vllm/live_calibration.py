"""Calibrating the dispatcher on what it serves, over real vLLM servers.

Two vLLM CPU servers (one core each, the ``mini`` random-weight checkpoint, as
``bench/real_vllm/vllm_bench.py``) are profiled once (``hfx/backends/vllm/profiler.py``'s quick
grid, what ``hfx serve --engine vllm`` measures at start). Then the same four-task trace is served
under HFX ``--trials`` times each way, alternating:

- **static**: the dispatcher plans with the profile as measured;
- **live**: a ``LiveCalibrator`` (``hfx serve --calibrate-every``) refits the decode scale every
  ``--every`` seconds on the requests finished so far and the dispatcher plans with it.

For every run: attainment and mean latencies, the fits the live calibrator applied, and a
held-out test of calibrating on served requests: the run's finished requests split into
consecutive windows by dispatch time, each window predicted
(``hfx.evaluation.calibration.replay``) with the fit on the window before it, against the
profile alone. The served requests are kept beside the JSON (``*.served.jsonl``), so other
estimators can be tried on them without serving again.

    python bench/real_vllm/live_calibration.py --vllm-python /tmp/vllm/bin/python \
        --json docs/results/vllm-live-calibration.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from hfx.assembly import build_cluster
from hfx.backends.vllm.process import VLLMPlacement
from hfx.backends.vllm.profiler import VLLMGrid, profile_vllm
from hfx.cluster.control import ControlPlane, TokenEvent
from hfx.evaluation import write_json
from hfx.evaluation.calibration import ReplayEngine, Served, fit_served, replay
from hfx.model.build import write_random_checkpoint
from hfx.records.metrics import summarize
from hfx.request import Outcome, Request
from hfx.serving.calibrator import LiveCalibrator, served
from hfx.workloads.kinds import workload_tasks
from hfx.workloads.load import generate

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.real_vllm.vllm_bench import (
    BLOCK,
    KV_TOKENS,
    MAX_SEQS,
    VLLM_TOKEN_BUDGET,
    cold_starts,
    mini_launch,
    vllm_config,
    with_prompts,
)

ENGINE = ReplayEngine("chunked", VLLM_TOKEN_BUDGET, MAX_SEQS, KV_TOKENS, BLOCK)


async def serve(control: ControlPlane, requests: list[Request],
                calibrator: LiveCalibrator | None) -> float:
    """Submit ``requests`` at their arrival times on the real clock; every request that ends
    is shown to ``calibrator``; returns the seconds until the last one ended."""
    loop = asyncio.get_running_loop()
    await control.start()
    if calibrator is not None:
        calibrator.start()
    t0 = loop.time()

    def ended(rid: str):
        def listen(event: TokenEvent) -> None:
            if event.token is None and calibrator is not None:
                calibrator.observe(control.records[rid])
        return listen

    for req in requests:
        delay = t0 + req.arrival - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        control.submit(Request(req.id, loop.time(), req.prompt_len, req.max_tokens, req.slo,
                               req.task, prompt_token_ids=req.prompt_token_ids), ended(req.id))
    await asyncio.wait_for(control.wait_idle(), timeout=600)
    end = loop.time() - t0
    if calibrator is not None:
        await calibrator.stop()
    await control.stop()
    return end


def held_out(data: list[Served], base, windows: int) -> list[dict]:
    """Each window after the first predicted with the fit on the one before, and with the
    profile alone: relative errors of the mean TTFT (with the fit's delivery) and TPOT. The
    replay of a window runs the window before it first, so its batches start as full as they
    were; only the window's own requests are scored."""
    data = sorted(data, key=lambda s: s.dispatched)
    size = len(data) // windows
    parts = [data[i * size:(i + 1) * size] for i in range(windows)]
    out = []
    for before, part in itertools.pairwise(parts):
        fit = fit_served(base, before, ENGINE)
        both = before + part
        scored = frozenset(range(len(before), len(both)))
        real_ttft = sum(s.ttft for s in part) / len(part)
        real_tpot = sum(s.tpot for s in part) / len(part)
        ttft, tpot = replay(fit.apply(base), both, ENGINE, scored)
        p_ttft, p_tpot = replay(base, both, ENGINE, scored)
        out.append({"requests": len(part), "fit_on_previous": asdict(fit),
                    "real": {"ttft": real_ttft, "tpot": real_tpot},
                    "error_calibrated": {"ttft": (ttft + fit.delivery) / real_ttft - 1,
                                         "tpot": tpot / real_tpot - 1},
                    "error_profile": {"ttft": p_ttft / real_ttft - 1,
                                      "tpot": p_tpot / real_tpot - 1}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", default=sys.executable)
    ap.add_argument("--qps", type=float, default=6.0)
    ap.add_argument("--requests-per-task", type=int, default=120)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--every", type=float, default=20.0, help="seconds between live fits")
    ap.add_argument("--windows", type=int, default=4, help="held-out windows per run")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hfx-live-cal-"))
    checkpoint = str(write_random_checkpoint("mini", work / "mini"))
    servers, _ = cold_starts(mini_launch(args.vllm_python, checkpoint), 2)
    urls = [s.url for s in servers]
    result: dict = {"command": "python bench/real_vllm/live_calibration.py "
                               + " ".join(sys.argv[1:]),
                    "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
                    "model": "mini (3.3M parameters, random weights), float32, vLLM 0.32.0 CPU",
                    "qps": args.qps, "every_s": args.every, "runs": []}
    try:
        profile = profile_vllm(urls, VLLMGrid.quick(), KV_TOKENS, BLOCK, checkpoint,
                               progress=True)
        result["profile"] = {"model": asdict(profile.model), "fit_mape": profile.fit_mape}
        config = vllm_config("hfx", args.qps, 0)
        requests = with_prompts(generate("four-task", args.qps, 0, args.requests_per_task), 0)
        served_rows: list[dict] = []
        for trial in range(args.trials):
            for mode in ("static", "live"):
                placement = VLLMPlacement(None, tuple(urls), MAX_SEQS)
                control = build_cluster(config, profile, placement=placement,
                                        tasks=workload_tasks("four-task"), seed=0)
                calibrator = (LiveCalibrator(control, profile.model, ENGINE, args.every)
                              if mode == "live" else None)
                fits: list[dict] = []
                if calibrator is not None:  # remember each fit as it is applied
                    inner = calibrator.calibrate

                    async def logged(inner=inner, calibrator=calibrator, fits=fits):
                        fit = await inner()
                        if fit is not None:
                            fits.append({"t": asyncio.get_running_loop().time(),
                                         "applied": calibrator.last is fit, **asdict(fit)})
                        return fit

                    calibrator.calibrate = logged  # type: ignore[method-assign]
                seconds = asyncio.run(serve(control, requests, calibrator))
                records = list(control.records.values())
                done = [r for r in records if r.outcome is Outcome.FINISHED]
                data = [s for s in map(served, records) if s is not None]
                run_ = {"trial": trial, "mode": mode, "seconds": seconds,
                        "summary": summarize(records, [(0.0, seconds)]),
                        "mean_ttft": sum(r.ttft for r in done) / len(done),
                        "mean_tpot": sum(r.tpot for r in done) / len(done),
                        "fits": fits, "held_out": held_out(data, profile.model, args.windows)}
                served_rows += [{"trial": trial, "mode": mode, **rounded(asdict(s))}
                                for s in data]
                result["runs"].append(run_)
                ho = run_["held_out"]
                print(f"trial {trial} {mode}: attainment {run_['summary']['attainment']:.3f}, "
                      f"mean TTFT {run_['mean_ttft'] * 1e3:.0f} ms, TPOT "
                      f"{run_['mean_tpot'] * 1e3:.1f} ms; fits "
                      f"{[round(f['decode_scale'], 2) for f in fits]}; held-out TPOT error "
                      f"calibrated {[round(h['error_calibrated']['tpot'], 3) for h in ho]} "
                      f"profile {[round(h['error_profile']['tpot'], 3) for h in ho]}",
                      flush=True)
    finally:
        for s in servers:
            s.kill()
    if args.json:
        write_json(args.json, result)
        rows = Path(args.json).with_suffix(".served.jsonl")
        rows.write_text("".join(json.dumps(r) + "\n" for r in served_rows))
        print(f"wrote {rows}")
    return 0


def rounded(obj):
    """Microseconds are enough for latencies of milliseconds, and halve the file."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: rounded(v) for k, v in obj.items()}
    return obj


if __name__ == "__main__":
    raise SystemExit(main())
