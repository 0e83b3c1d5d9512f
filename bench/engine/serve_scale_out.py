"""Scale-out of ``hfx serve`` for real: time from the Scaler's decision to the first
token served by the new instance, per weight path (HyperFlexis §6, Table 2).

An in-process server with one instance of a random-weight model and the Scaler (max 2) is
asked to scale out (``Scaler.scale_out_now``). The new instance loads its weights through the
WeightManager by the configured path — ``d2d`` from the running peer's published segment,
``cpu`` from a host-memory copy, ``disk`` from the checkpoint (saved at start; its page cache
dropped before each load, so the bytes come from the disk) — on a worker thread while the loop
serves. Once it joins, the old instance is drained so that the next request must go to the new
one; that request's first token ends the measurement.

    python bench/engine/serve_scale_out.py --json docs/results/serve_scale_out.json

Reported per shape and path (median of ``--repeat`` runs): ``ready_s`` (decision → serving),
``ttft_s`` (the first request on it), ``total_s`` (decision → first token).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from hfx.backends import engine_spec
from hfx.config import ServeConfig
from hfx.evaluation import write_json
from hfx.request import SLO, Request
from hfx.serving.build import build_server

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.engine.scaling_speed import drop_page_cache

PROMPT = list(range(3, 35))  # 32 tokens


def one_scale_out(config: ServeConfig) -> dict[str, float]:
    control = build_server(config).control  # outside a loop: it may profile the model
    return asyncio.run(_scale_out(control, config))


async def _scale_out(control, config: ServeConfig) -> dict[str, float]:
    sources = engine_spec._SOURCES[engine_spec.EngineSpec(
        "torch", 0, shape=config.shape, device="cpu")._key()]
    if config.weight_path == "disk":
        drop_page_cache(Path(sources.checkpoint))
    await control.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    new = control.scaler.scale_out_now(control.instances[0].role, "bench")
    while new not in control.instances:
        await asyncio.sleep(0.001)
    ready = loop.time()
    control.drain(0)  # the next request can only go to the new instance
    record = control.submit(Request("probe", ready, len(PROMPT), 4, SLO(60.0, 60.0),
                                    prompt_token_ids=PROMPT))
    await asyncio.wait_for(control.wait_idle(), 120)
    assert record.instance == new and record.first_token_time is not None
    await control.stop()
    return {"ready_s": ready - t0, "ttft_s": record.first_token_time - ready,
            "total_s": record.first_token_time - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="tiny,qwen2.5-0.5b")
    ap.add_argument("--paths", default="d2d,cpu,disk")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        for path in args.paths.split(","):
            # The dispatcher's profile does not matter here: the shipped one spares profiling.
            config = ServeConfig(shape=shape, device="cpu", instances=1, max_instances=2,
                                 weight_path=path, policy="rr", priorities=1,
                                 kv_capacity_tokens=4096, profile="tiny@cpu")
            runs = [one_scale_out(config) for _ in range(args.repeat)]
            row = {"shape": shape, "path": path, "runs": runs,
                   **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
            print(f"{shape:14s} {path:5s} ready {row['ready_s']:.3f} s  ttft "
                  f"{row['ttft_s']:.3f} s  total {row['total_s']:.3f} s")
            rows.append(row)
    write_json(args.json, {"command": "python bench/engine/serve_scale_out.py --json ...",
                           "repeat": args.repeat, "rows": rows})


if __name__ == "__main__":
    main()
