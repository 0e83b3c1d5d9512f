"""Gateway speed (issue 9): what the HTTP layer sustains and what it adds to TTFT.

Starts ``hfx serve --executor sim`` in its own process (instances on a fast profile, so the
engines are not the bottleneck), drives it with ``hfx bench``'s client from this process at
rising QPS, and reports per load: requests/s finished, errors, and the gateway's overhead on
TTFT = client-measured TTFT − the server's own (arrival at the control plane → first token,
returned in each stream's final chunk), p50 and p99. Target: overhead p50 ≤ 2 ms.

    python bench/gateway_speed.py --json docs/results/gateway_speed.json
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

from hfx.bench import write_json
from hfx.bench.client import drive
from hfx.bench.workloads import load_workload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, instances: int, profile: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "hfx.cli", "serve", "--executor", "sim",
                             "--port", str(port), "--instances", str(instances), "--profile",
                             profile, "--policy", "rr"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("hfx serve did not come up")
        time.sleep(0.2)


def one_load(url: str, qps: float, per_task: int, seed: int) -> dict:
    requests = load_workload("four-task", qps, seed, per_task)
    timing: dict[str, dict] = {}
    records, duration, _ = asyncio.run(drive(url, requests, seed, False, timing=timing))
    overhead = []
    for r in records:
        server = timing.get(r.request.id)
        if server and r.token_times and server["ttft_ms"] is not None:
            client_ttft = (r.token_times[0] - r.dispatch_time) * 1e3
            overhead.append(client_ttft - server["ttft_ms"])
    done = [r for r in records if r.outcome.value == "finished"]
    ov = np.array(overhead)
    return {"qps": qps, "requests": len(records), "finished": len(done),
            "errors": len(records) - len(done), "seconds": duration,
            "finished_per_s": len(done) / duration,
            "tokens_per_s": sum(r.num_tokens for r in done) / duration,
            "overhead_ms": {"p50": float(np.percentile(ov, 50)),
                            "p99": float(np.percentile(ov, 99)),
                            "mean": float(ov.mean())} if len(ov) else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=float, nargs="+", default=[10, 25, 50, 100])
    ap.add_argument("--seconds", type=float, default=10.0, help="arrivals per load")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--profile", default="qwen2.5-7b@h200")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    port = free_port()
    proc = start_server(port, args.instances, args.profile)
    try:
        loads = []
        for qps in args.qps:
            per_task = max(1, round(qps * args.seconds / 4))
            loads.append(one_load(f"http://127.0.0.1:{port}", qps, per_task, args.seed))
            ld = loads[-1]
            ov = ld["overhead_ms"] or {}
            print(f"qps {qps:g}: {ld['finished']}/{ld['requests']} finished, "
                  f"{ld['finished_per_s']:.1f} req/s, {ld['tokens_per_s']:.0f} tok/s, "
                  f"TTFT overhead p50 {ov.get('p50', float('nan')):.2f} ms "
                  f"p99 {ov.get('p99', float('nan')):.2f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result = {"loads": loads, "instances": args.instances, "profile": args.profile,
              "executor": "sim", "workload": "four-task"}
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
