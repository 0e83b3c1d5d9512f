"""Check the simulator's shipped H200 profile of Llama-3.1-8B against HFX's own engine on an H200.

The shipped profile ``hfx/stepmodel/profiles/llama-3.1-8b@h200.json`` is computed (a roofline
with assumed efficiencies and a 3 ms step overhead, fitted to Eq. 1/2: hfx/stepmodel/roofline.py).
This script measures what ``hfx profile`` measures, on the real thing: HFX's own PyTorch engine
(TorchExecutor, eager, random weights of Llama-3.1-8B's shape, bf16), one step per grid point of
HyperFlexis Appendix A (batches 1…192, lengths 4…2020, prefill steps up to 16,384 tokens; no
prefix-hit points unless ``--cached``), timed by the profiler's own functions (grid_step,
_measure_points: the mean of at least 3 runs and 0.2 s after a warm-up) and fitted by its own
``fit_profile``. It then evaluates the shipped profile with the simulator's own step-time code
(``Profile`` / ``StepTimeModel.step_time`` on a ``BatchShape``) at every measured point and
reports per phase the MAPE and the ratio measured / shipped, overall, at small (B <= 8) and large
(B >= 64) batches and per batch size. Where time allows it also times one decode step against
the number of layers and counts the GPU kernels of a few steps (torch.profiler), which explains
the gap. It writes one JSON (command, date, commit, device, torch version, the measured profile,
the comparison, the raw timings) from which the comparison is recomputed on a CPU.

How ``hfx profile`` differs: it draws the weights on the CPU (8 B parameters: a minute; here
they are drawn on the device, and step times do not depend on their values), and measures the
whole grid in one call (here point by point, under a time budget, so
that a slow device still returns what it measured).

On the GPU machine (PyTorch with CUDA; HFX not installed: run from the repository root):

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 bench/gpu/h200_profile_check.py \
        --commit <sha> --budget-s 240 --json $OUT/h200_profile_check.json \
        --profile-out $OUT/llama-3.1-8b_h200_measured.json

Here, from what came back (no GPU needed; the comparison recomputed from the measured samples):

    .venv/bin/python bench/gpu/h200_profile_check.py \
        --measured docs/data/gpu/h200_profile_check.json \
        --json docs/data/gpu/h200_profile_check.json

A CPU smoke test of the measuring path: ``--shape tiny --quick --budget-s 20 --json /tmp/x.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial as partial_fn
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hfx.model.shapes import ModelShape, get_shape  # noqa: E402
from hfx.stepmodel.fit import samples_of  # noqa: E402
from hfx.stepmodel.latency import BatchShape, Profile, load_profile  # noqa: E402
from hfx.stepmodel.roofline import HARDWARE, MODELS, Roofline  # noqa: E402

SHIPPED = "llama-3.1-8b@h200"
SMALL_BATCH = 8  # "small": B <= 8
LARGE_BATCH = 64  # "large": B >= 64
Point = tuple[str, int, int, int]  # the profiler's (kind, batch, length, cached)


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


# ---- measuring (needs torch) ------------------------------------------------------------------

def random_weights(shape: ModelShape, dtype: Any, device: str, seed: int) -> Any:
    """The project's model with N(0, 0.02) weights and unit norms, as ``random_model`` makes
    them, but drawn on ``device`` (its generator) rather than on the CPU."""
    import torch

    from hfx.model.weights import INIT_STD, empty_model, init_buffers

    model = empty_model(shape, dtype, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD, generator=gen)
    init_buffers(model, device)
    return model.eval()


def kv_tokens_for(grid: Any, block_size: int) -> int:
    """The smallest KV cache (a whole number of blocks) that holds every grid point."""
    need = max([b * (n + 2) for b in grid.decode_batches for n in grid.lengths]
               + [b * (n + k + 1) for b in grid.prefill_batches for n in grid.lengths
                  for k in (0, *grid.cached) if b * n <= grid.max_prefill_tokens])
    return math.ceil(need / block_size) * block_size


def measure_grid(executor: Any, points: list[Point], repeats: int, capacity_tokens: int,
                 seed: int, budget_s: float, partial: Path | None) -> tuple[Any, dict]:
    """Each point through the profiler's own ``_measure_points`` (grid_step, _timed), until
    ``budget_s`` is spent; returns the samples and how far it got."""
    from hfx.engine.profiler import _measure_points

    prefill: list = []
    decode: list = []
    start = time.perf_counter()
    done = 0
    for i, point in enumerate(points):
        if time.perf_counter() - start > budget_s:
            break
        p, d = asyncio.run(_measure_points(executor, [point], repeats, capacity_tokens,
                                           seed + i, False))
        prefill += p
        decode += d
        done += 1
        if done % 20 == 0 or done == len(points):
            took = time.perf_counter() - start
            print(f"  {done}/{len(points)} points, {took:.0f} s", flush=True)
            if partial is not None:
                partial.write_text(json.dumps({"prefill": prefill, "decode": decode}) + "\n")
    took = time.perf_counter() - start
    return (prefill, decode), {"points": len(points), "measured": done,
                               "skipped": len(points) - done, "seconds": round(took, 1)}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def layer_sweep(executor: Any, model: Any, kind: str, b: int, n: int,
                layer_counts: list[int], seed: int) -> dict:
    """One step's wall time with the first k layers only (k in ``layer_counts``): slope = time
    per layer, intercept = what a step costs besides its layers (embedding, LM head, sampling,
    building the batch, the hand-off to the model thread)."""
    import numpy as np
    from torch import nn

    from hfx.engine.block_manager import BlockManager
    from hfx.engine.profiler import grid_step, step_times

    layers, caches = model.model.layers, executor.caches
    rows = []
    try:
        for k in layer_counts:
            model.model.layers = nn.ModuleList(list(layers)[:k])
            executor.caches = caches[:k]
            gen = np.random.default_rng(seed)
            out = grid_step(kind, b, n, BlockManager(len(caches[0][0]) // executor.block_size,
                                                     executor.block_size),
                            gen, executor.vocab_size)
            times = asyncio.run(step_times(executor, out, 20, 0.3))
            rows.append({"layers": k, "runs": len(times), "mean_ms": statistics.fmean(times) * 1e3,
                         "median_ms": statistics.median(times) * 1e3})
    finally:
        model.model.layers, executor.caches = layers, caches
    x = np.array([r["layers"] for r in rows], float)
    y = np.array([r["mean_ms"] for r in rows])
    slope, intercept = np.polyfit(x, y, 1)
    return {"step": f"{kind} B={b} n={n}", "rows": rows, "ms_per_layer": float(slope),
            "ms_outside_layers": float(intercept)}


def kernel_census(executor: Any, kind: str, b: int, n: int, steps: int, seed: int) -> dict:
    """``steps`` runs of one step under torch.profiler: wall time per step, GPU kernels per step
    and their summed time (the GPU's busy time), the top kernels by time."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hfx.engine.block_manager import BlockManager
    from hfx.engine.profiler import grid_step

    gen = np.random.default_rng(seed)
    out = grid_step(kind, b, n, BlockManager(len(executor.caches[0][0]) // executor.block_size,
                                             executor.block_size), gen, executor.vocab_size)
    executor.run(out)
    _sync(executor.device)
    walls = []
    acts = [ProfilerActivity.CPU]
    if executor.device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            executor.run(out)
            _sync(executor.device)
            walls.append(time.perf_counter() - t0)
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in gpu:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:8]
    busy_us = sum(sum(v) for v in by_name.values())
    return {"step": f"{kind} B={b} n={n}", "steps": steps,
            "wall_ms_per_step": statistics.fmean(walls) * 1e3,
            "gpu_events_per_step": len(gpu) / steps,
            "gpu_busy_ms_per_step": busy_us / 1e3 / steps,
            "memcpy_events_per_step": sum(1 for e in gpu if "memcpy" in e.name.lower()) / steps,
            "top_kernels": [{"name": k[:120], "calls_per_step": len(v) / steps,
                             "ms_per_step": sum(v) / 1e3 / steps} for k, v in top]}


def measure(args: argparse.Namespace) -> dict:
    import torch

    from hfx.engine.profiler import Grid, grid_points, profile_meta
    from hfx.engine.torch_executor import TorchExecutor
    from hfx.model.build import default_device, resolve_dtype
    from hfx.stepmodel.fit import fit_profile

    t_start = time.perf_counter()
    device = args.device or default_device()
    dtype = resolve_dtype(args.dtype, device)
    grid = Grid.quick() if args.quick else Grid.full()
    grid = replace(grid, cached=tuple(args.cached))
    if args.repeats is not None:
        grid = replace(grid, repeats=args.repeats)
    kv_tokens = args.kv_tokens or kv_tokens_for(grid, args.block_size)
    shape = get_shape(args.shape)
    t0 = time.perf_counter()
    model = random_weights(shape, dtype, device, args.weight_seed)
    _sync(torch.device(device))
    build_s = time.perf_counter() - t0
    executor = TorchExecutor(model, kv_tokens // args.block_size, args.block_size,
                             threaded=True, seed=0)
    points = grid_points(grid, kv_tokens, 0)
    print(f"{args.shape} on {device} ({dtype}), weights in {build_s:.1f} s; "
          f"{len(points)} grid points, KV {kv_tokens} tokens", flush=True)
    partial = Path(args.json).with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)
    (prefill, decode), progress = measure_grid(executor, points, grid.repeats, kv_tokens, 0,
                                               args.budget_s, partial)
    meta = profile_meta(args.shape, shape, executor, grid)
    dev = executor.device
    hw = "cuda" if dev.type == "cuda" else "cpu"
    profile = fit_profile(f"{args.shape}-random@{hw}", prefill, decode, kv_tokens,
                          args.block_size, meta)
    if args.profile_out:
        Path(args.profile_out).parent.mkdir(parents=True, exist_ok=True)
        profile.save(args.profile_out)
    print(f"measured {progress['measured']}/{progress['points']} points in "
          f"{progress['seconds']} s; fit MAPE {profile.fit_mape}", flush=True)

    raw: dict[str, Any] = {"weights_build_s": round(build_s, 2)}
    extras: list[tuple[str, Callable[[], dict]]] = []
    layers = shape.num_hidden_layers
    counts = sorted({layers, max(1, layers // 2), max(1, layers // 4), max(1, layers // 8)})
    big_b = max(grid.decode_batches)
    big_n = max(n for n in grid.lengths if big_b * (n + 2) <= kv_tokens)
    pb = max(b for b in grid.prefill_batches if b * 64 <= grid.max_prefill_tokens)
    # Most telling first: what is left when the budget runs out is skipped.
    extras.append(("kernels_decode_b1", partial_fn(kernel_census, executor, "d", 1, 128, 5, 3)))
    extras.append(("decode_b1_vs_layers",
                   partial_fn(layer_sweep, executor, model, "d", 1, 128, counts, 1)))
    extras.append(("kernels_prefill_many_spans",
                   partial_fn(kernel_census, executor, "p", pb, 64, 3, 3)))
    extras.append(("kernels_decode_large",
                   partial_fn(kernel_census, executor, "d", big_b, big_n, 3, 3)))
    extras.append(("prefill_b1_vs_layers",
                   partial_fn(layer_sweep, executor, model, "p", 1, 128, counts, 2)))
    extras.append(("kernels_prefill_b1", partial_fn(kernel_census, executor, "p", 1, 1024, 3, 3)))
    for name, fn in extras:
        if time.perf_counter() - t_start > args.budget_s + args.extras_s:
            raw[name] = {"skipped": "out of time"}
            continue
        try:
            raw[name] = fn()
            print(f"  {name}: {json.dumps(raw[name])[:300]}", flush=True)
        except Exception as e:  # a diagnostic must not lose the profile
            raw[name] = {"error": repr(e)[:500]}
            print(f"  {name} failed: {e!r}", flush=True)
    if dev.type == "cuda":
        raw["max_memory_allocated_gb"] = round(torch.cuda.max_memory_allocated(dev) / 1e9, 2)
    executor.shutdown()
    return {
        "device": meta["device"],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dtype": meta["dtype"],
        "shape": args.shape,
        "weights": f"random N(0, 0.02), seed {args.weight_seed}, drawn on {device}",
        "kv_tokens": kv_tokens,
        "progress": progress,
        "measured_profile": profile.to_json(),
        "raw": raw,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }


# ---- comparing (no torch) ---------------------------------------------------------------------

def _stats(rows: list[dict]) -> dict:
    if not rows:
        return {"n": 0}
    ratios = [r["measured_ms"] / r["shipped_ms"] for r in rows]
    out = {"n": len(rows),
           "mape": statistics.fmean(abs(r["shipped_ms"] - r["measured_ms"]) / r["measured_ms"]
                                    for r in rows),
           "mean_ratio": statistics.fmean(ratios), "median_ratio": statistics.median(ratios),
           "min_ratio": min(ratios), "max_ratio": max(ratios)}
    roof = [r for r in rows if r.get("roofline_ms")]
    if roof:
        out["roofline_mape"] = statistics.fmean(abs(r["roofline_ms"] - r["measured_ms"])
                                                / r["measured_ms"] for r in roof)
        out["mean_ratio_to_roofline"] = statistics.fmean(r["measured_ms"] / r["roofline_ms"]
                                                         for r in roof)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def compare(measured: Profile, shipped: Profile) -> dict:
    """The shipped profile's step time (the simulator's own StepTimeModel.step_time on a
    BatchShape) at every measured point, and the roofline it was fitted to."""
    rl = Roofline(MODELS["llama-3.1-8b"], HARDWARE["h200"])
    prefill, decode = samples_of(measured)
    rows: dict[str, list[dict]] = {"prefill": [], "decode": []}
    for lengths, t, k in prefill:
        shape = BatchShape()
        for n in lengths:
            shape.add_prefill(n, k)
        rows["prefill"].append({
            "batch": len(lengths), "length": lengths[0], "cached": k, "measured_ms": t * 1e3,
            "shipped_ms": shipped.model.step_time(shape) * 1e3,
            "roofline_ms": None if k else rl.prefill(list(lengths)) * 1e3,
            "own_fit_ms": measured.model.step_time(shape) * 1e3})
    for b, ctx, t in decode:
        shape = BatchShape()
        for i in range(b):
            shape.add_decode(ctx // b + (1 if i < ctx % b else 0))
        rows["decode"].append({
            "batch": b, "context": ctx // b, "measured_ms": t * 1e3,
            "shipped_ms": shipped.model.step_time(shape) * 1e3,
            "roofline_ms": rl.decode(b, ctx) * 1e3,
            "own_fit_ms": measured.model.step_time(shape) * 1e3})
    out: dict[str, Any] = {"small_batch": f"B <= {SMALL_BATCH}",
                           "large_batch": f"B >= {LARGE_BATCH}"}
    for phase, rs in rows.items():
        rs.sort(key=lambda r: (r["batch"], r.get("length", r.get("context")), r.get("cached", 0)))
        batches = sorted({r["batch"] for r in rs})
        out[phase] = {
            "all": _stats(rs),
            "small": _stats([r for r in rs if r["batch"] <= SMALL_BATCH]),
            "large": _stats([r for r in rs if r["batch"] >= LARGE_BATCH]),
            "by_batch": {str(b): _stats([r for r in rs if r["batch"] == b]) for b in batches},
            "points": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                       for r in rs],
        }
    m, s = measured.model, shipped.model
    out["coefficients"] = {
        "measured": {"prefill": [m.prefill_a, m.prefill_b, m.prefill_c],
                     "decode": [m.decode_a, m.decode_b, m.decode_c]},
        "shipped": {"prefill": [s.prefill_a, s.prefill_b, s.prefill_c],
                    "decode": [s.decode_a, s.decode_b, s.decode_c]},
        "form": "prefill a + b·Σl + c·Σl² ; decode a' + b'·Σctx + c'·B (seconds)"}
    out["measured_fit_mape"] = measured.fit_mape
    return out


def summary(cmp: dict) -> str:
    lines = []
    for phase in ("prefill", "decode"):
        for part in ("all", "small", "large"):
            s = cmp[phase][part]
            if not s.get("n"):
                continue
            lines.append(f"{phase:7s} {part:5s} n={s['n']:3d}  MAPE(shipped) {s['mape']:7.1%}  "
                         f"measured/shipped mean {s['mean_ratio']:.2f} "
                         f"(median {s['median_ratio']:.2f}, {s['min_ratio']:.2f}"
                         f"-{s['max_ratio']:.2f})  measured/roofline "
                         f"{s.get('mean_ratio_to_roofline', float('nan')):.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", help="a measured profile JSON, or this script's JSON: compare "
                    "only, measure nothing")
    ap.add_argument("--json", required=True, help="where to write the check's JSON")
    ap.add_argument("--profile-out", help="also write the measured profile (hfx sim --profile)")
    ap.add_argument("--shape", default="llama-3.1-8b", help="a shapes.py name")
    ap.add_argument("--device", default=None, help="default cuda when present, else cpu")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on a GPU, float32 on CPU")
    ap.add_argument("--quick", action="store_true", help="the profiler's quick grid")
    ap.add_argument("--cached", type=int, nargs="*", default=[],
                    help="prefix-hit points' cached lengths (hfx profile's: 256 1024 4096)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--kv-tokens", type=int, default=None, help="default: what the grid needs")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--weight-seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="seconds of grid measurement; points left then are skipped")
    ap.add_argument("--extras-s", type=float, default=60.0,
                    help="seconds after the grid for the raw timings")
    ap.add_argument("--commit", default=None, help="default: git rev-parse HEAD, if it answers")
    args = ap.parse_args()

    command = " ".join(sys.argv)
    if args.measured:
        data = json.loads(Path(args.measured).read_text())
        if "measured_profile" in data:
            result = data
            profile = Profile.from_json(data["measured_profile"])
        else:
            profile = Profile.from_json(data)
            result = {"measured_profile": data, "device": profile.meta.get("device")}
        result.setdefault("command", None)
        result["compared_by"] = {"command": command,
                                 "date": dt.datetime.now(dt.timezone.utc).isoformat(
                                     timespec="seconds"),
                                 "commit": args.commit or git_commit()}
    else:
        result = {"command": command,
                  "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "commit": args.commit or git_commit()}
        result.update(measure(args))
        profile = Profile.from_json(result["measured_profile"])
    shipped = load_profile(SHIPPED)
    result["shipped_profile"] = shipped.to_json()
    result["comparison"] = compare(profile, shipped)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result["comparison"]))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
