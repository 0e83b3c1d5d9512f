"""Fast scaling: time-to-serve of a new instance by weight path — disk, CPU offload,
peer (HyperFlexis Table 2: Qwen-7B 4.14 s / 2.73 s / 0.89 s on Ascend).

A source instance runs the model and publishes its weights (WeightManager.share). For each path a
warm-pool instance (parameter memory allocated and touched, no weights: ``warm_model``) is timed
from the start of its weight load until it has served one token:

- disk: safetensors from the checkpoint, with the file's page cache dropped first
  (posix_fadvise DONTNEED), so the bytes really come from the disk;
- cpu: from a host-memory copy of the weights (OffloadedWeights);
- d2d: copied from the running peer's shared-memory segment, in another process.

On a CPU-only machine "device" memory is host memory, so cpu and d2d are both memory copies; on a
GPU they would be a host-to-device DMA and a device-to-device copy. Sizes that do not fit twice in
this machine's memory (Qwen2.5-7B in bfloat16 is 15.2 GB) are measured on fewer layers of the same
shape (``--layers``) and extrapolated to the full model by bandwidth.

    python bench/engine/scaling_speed.py --json results/scaling_speed.json  # 7B shape, 6 layers
    python bench/engine/scaling_speed.py --shape qwen2.5-0.5b --layers 0 --json r.json  # all

Writes the measured seconds per path in the form ``--load-profile`` of ``hfx sim`` reads
(``{"load_seconds": {...}}``), extrapolated to the full model.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hfx.evaluation import write_json
from hfx.model.shapes import get_shape
from hfx.model.weight_manager import OffloadedWeights, WeightManager, load_weights, warm_model
from hfx.model.weights import (
    init_buffers,
    load_state,
    random_model,
    read_config,
    read_state_dict,
    save_checkpoint,
)


def drop_page_cache(checkpoint: Path) -> None:
    os.sync()
    for f in checkpoint.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def first_token(model) -> None:
    """The instance serves: one forward pass of a one-token prompt through a fresh KV cache."""
    from hfx.engine.block_manager import BlockManager
    from hfx.engine.planners.base import SchedulerOutput
    from hfx.engine.sequence import Sequence
    from hfx.engine.torch_executor import TorchExecutor

    executor = TorchExecutor(model, 4, 16, threaded=False)
    seq = Sequence("warm", 1, 1, prompt_token_ids=[0])
    BlockManager(4, 16).allocate(seq, 2)
    out = SchedulerOutput()
    out.schedule(seq, 1)
    executor.run(out)


def _peer_child(checkpoint: str, handle, dtype: str, out) -> None:
    warm = warm_model(read_config(checkpoint), getattr(torch, dtype))
    t0 = time.perf_counter()
    model, path = load_weights(checkpoint, handle, getattr(torch, dtype), into=warm)
    t1 = time.perf_counter()
    first_token(model)
    out.put((path, t1 - t0, time.perf_counter() - t0))


def time_disk(checkpoint: Path, shape, dtype) -> tuple[float, float]:
    drop_page_cache(checkpoint)
    model = warm_model(shape, dtype)
    t0 = time.perf_counter()
    load_state(model, read_state_dict(checkpoint))
    init_buffers(model, "cpu")
    t1 = time.perf_counter()
    first_token(model)
    return t1 - t0, time.perf_counter() - t0


def time_cpu(offloaded: OffloadedWeights, shape, dtype) -> tuple[float, float]:
    model = warm_model(shape, dtype)
    t0 = time.perf_counter()
    offloaded.restore(model)
    init_buffers(model, "cpu")
    t1 = time.perf_counter()
    first_token(model)
    return t1 - t0, time.perf_counter() - t0


def time_peer(checkpoint: Path, handle, dtype: str) -> tuple[float, float]:
    ctx = mp.get_context("spawn")  # the new instance is its own process
    out = ctx.Queue()
    child = ctx.Process(target=_peer_child, args=(str(checkpoint), handle, dtype, out))
    child.start()
    path, load, serve = out.get(timeout=600)
    child.join()
    if path != "d2d":
        raise RuntimeError("the peer path fell back to disk")
    return load, serve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2.5-7b")
    ap.add_argument("--layers", type=int, default=6,
                    help="decoder layers to build (0: all); the rest is extrapolated")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a "
                    "temporary folder on the working disk)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()

    full = get_shape(args.shape)
    shape = get_shape(args.shape, num_hidden_layers=args.layers) if args.layers else full
    dtype = getattr(torch, args.dtype)
    elem = torch.empty((), dtype=dtype).element_size()
    with tempfile.TemporaryDirectory(dir=args.dir or ".") as tmp:
        ckpt = Path(tmp) / "ckpt"
        source = random_model(shape, seed=0, dtype=dtype)
        save_checkpoint(source, ckpt)
        nbytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
        manager = WeightManager(source)
        handle = manager.share()
        offloaded = OffloadedWeights(source)
        times: dict[str, list[tuple[float, float]]] = {"disk": [], "cpu": [], "d2d": []}
        for _ in range(args.repeat):
            gc.collect()
            times["disk"].append(time_disk(ckpt, shape, dtype))
            gc.collect()
            times["cpu"].append(time_cpu(offloaded, shape, dtype))
            gc.collect()
            times["d2d"].append(time_peer(ckpt, handle, args.dtype))
        manager.close()

    full_bytes = full.num_parameters * elem
    result: dict = {"shape": args.shape, "layers": shape.num_hidden_layers,
                    "full_layers": full.num_hidden_layers, "dtype": args.dtype,
                    "bytes": nbytes, "full_bytes": full_bytes, "paths": {}}
    for path, ts in times.items():
        load = statistics.median(t[0] for t in ts)
        serve = statistics.median(t[1] for t in ts)
        start = serve - load  # building the executor and the first forward pass
        bw = nbytes / load
        result["paths"][path] = {
            "load_seconds": load, "serve_seconds": serve, "bandwidth_gb_s": bw / 1e9,
            "full_model_seconds": start + full_bytes / bw, "runs": ts,
        }
    p = result["paths"]
    result["d2d_speedup_vs_disk"] = p["disk"]["load_seconds"] / p["d2d"]["load_seconds"]
    result["load_seconds"] = {k: v["full_model_seconds"] for k, v in p.items()}
    for k, v in p.items():
        print(f"{k:5s} load {v['load_seconds']:.3f} s ({v['bandwidth_gb_s']:.2f} GB/s)  "
              f"serve {v['serve_seconds']:.3f} s  → full {args.shape}: "
              f"{v['full_model_seconds']:.2f} s")
    print(f"peer/disk speed-up: {result['d2d_speedup_vs_disk']:.1f}x "
          f"({nbytes / 1e9:.2f} GB measured, {full_bytes / 1e9:.2f} GB full)")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
