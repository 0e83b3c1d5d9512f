"""Measure a GPU's achieved GEMM throughput and HBM bandwidth, to check the efficiency factors
that hfx/stepmodel/roofline.py assumes for it (η_f, η_m). Needs PyTorch with CUDA; writes JSON.

    python bench/engine/device_roofline.py --json docs/data/h200_roofline.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    dev = torch.device("cuda")

    def timed(fn, reps: int = 20) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "gemm": [],
                 "copy": []}
    # GEMMs of a 7B/8B layer's shapes: tokens × hidden × intermediate, BF16.
    for tokens in (1, 16, 256, 2048, 8192):
        for k, n in ((4096, 14336), (3584, 18944)):
            a = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
            t = timed(lambda a=a, b=b: a @ b)
            out["gemm"].append({"m": tokens, "k": k, "n": n, "seconds": t,
                                "tflops": 2 * tokens * k * n / t / 1e12,
                                "weight_gbps": k * n * 2 / t / 1e9})
    for size_gb in (1, 4):
        x = torch.empty(int(size_gb * 1e9) // 2, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        t = timed(lambda x=x, y=y: y.copy_(x), reps=10)
        out["copy"].append({"gb": size_gb, "seconds": t, "gbps": 2 * size_gb / t})
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for g in out["gemm"]:
        print(f"gemm m={g['m']:<5} k={g['k']} n={g['n']}: {g['tflops']:7.1f} TFLOP/s, "
              f"weights read at {g['weight_gbps']:7.0f} GB/s")
    for c in out["copy"]:
        print(f"copy {c['gb']} GB: {c['gbps']:.0f} GB/s (read + write)")


if __name__ == "__main__":
    main()
