"""What running an instance as a Ray actor costs: the same requests on one in-process
instance and on one Ray actor, the tiny random-weight model on CPU.

Per token it records the engine's own time (the step that sampled it, shifted to the control
plane's clock) and the moment the control plane heard of it; the difference is the delivery lag
(zero in process; one long-poll answer through Ray otherwise). TTFT and TPOT are reported as the
control plane hears them.

    python bench/serving/ray_overhead.py --json docs/results/ray_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import replace

import numpy as np
import ray

from hfx.cluster.control import TokenEvent
from hfx.config import ServeConfig
from hfx.evaluation import write_json
from hfx.request import SLO, Request
from hfx.serving.build import build_server


def workload(n: int, qps: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.exponential(1 / qps)
        prompt = int(rng.integers(32, 256))
        out.append(Request(f"r{i}", t, prompt, 32, SLO(5.0, 1.0),
                           prompt_token_ids=rng.integers(0, 256, prompt).tolist()))
    return out


async def serve(config: ServeConfig, requests: list[Request]) -> dict:
    control = build_server(config).control
    loop = asyncio.get_running_loop()
    await control.start()
    heard: dict[str, list[float]] = {r.id: [] for r in requests}
    t0 = loop.time()
    for req in requests:
        await asyncio.sleep(max(0.0, t0 + req.arrival - loop.time()))
        times = heard[req.id]

        def listen(e: TokenEvent, times: list[float] = times) -> None:
            if e.token is not None:
                times.append(loop.time())

        control.submit(replace(req, arrival=loop.time()), listen)
    await asyncio.wait_for(control.wait_idle(), 600)
    await control.stop()
    lag, ttft, tpot = [], [], []
    for req in requests:
        rec, times = control.records[req.id], heard[req.id]
        lag += [h - t for h, t in zip(times, rec.token_times, strict=True)]
        ttft.append(times[0] - rec.request.arrival)
        tpot.append((times[-1] - times[0]) / (len(times) - 1))

    def ms(v: list[float]) -> dict:
        a = np.array(v) * 1e3
        return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
                "mean": float(a.mean())}

    return {"delivery_lag_ms": ms(lag), "ttft_ms": ms(ttft), "tpot_ms": ms(tpot)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--qps", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    requests = workload(args.requests, args.qps, args.seed)
    result = {"requests": args.requests, "qps": args.qps, "model": "tiny-random", "device": "cpu"}
    result["local"] = asyncio.run(serve(ServeConfig(instances=1), requests))
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    result["ray_init_seconds"] = time.monotonic() - started
    result["ray"] = asyncio.run(serve(ServeConfig(instances=1, ray=True), requests))
    ray.shutdown()
    for kind in ("local", "ray"):
        r = result[kind]
        print(f"{kind:5s}: delivery lag p50 {r['delivery_lag_ms']['p50']:.2f} ms "
              f"p99 {r['delivery_lag_ms']['p99']:.2f} ms; TTFT p50 {r['ttft_ms']['p50']:.1f} ms; "
              f"TPOT p50 {r['tpot_ms']['p50']:.2f} ms")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
