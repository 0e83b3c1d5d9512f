"""Gateway speed: what the HTTP layer sustains and what it adds to TTFT.

Starts ``hfx serve --executor sim`` in its own process (instances on a fast profile, so the
engines are not the bottleneck), drives it with ``hfx bench``'s client from this process at
rising QPS, and reports per load: requests/s finished, errors, and the gateway's overhead on
TTFT = client-measured TTFT − the server's own (arrival at the control plane → first token,
returned in each stream's final chunk), p50 and p99. Target: overhead p50 ≤ 2 ms.

Two clients measure it. The load client (httpx, asyncio, hundreds of streams in flight) sees
the overhead plus its own parsing and scheduling. A probe in a separate process sends one
streamed request at a time over a raw keep-alive socket while the load runs: its figure is what
the gateway adds (HTTP parse, validation, tokenize, submit; token → SSE chunk → socket), under
that load, with as little client in it as a client can have.

    python bench/serving/gateway_speed.py --json docs/results/gateway_speed.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import httpx
import numpy as np

from hfx.backends.vllm.process import free_port
from hfx.evaluation import write_json
from hfx.evaluation.client import drive
from hfx.workloads.kinds import load_workload


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


def probe(port: int, model: str, seconds: float, interval: float = 0.05) -> list[float]:
    """Gateway overhead (ms) of sequential streamed requests on a raw socket, for ``seconds``."""
    body = json.dumps({"model": model, "prompt": [1] * 64, "max_tokens": 2, "stream": True,
                       "ignore_eos": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: probe\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    out: list[float] = []
    end = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while time.monotonic() < end:
            sent = time.monotonic()
            s.sendall(head + body)
            buf, first = b"", None
            while b"[DONE]" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError("the server closed the probe's connection")
                buf += chunk
                if first is None and b'"text"' in buf:
                    first = time.monotonic()
            line = next(x for x in buf.split(b"\n") if b'"timing"' in x)
            server_ttft = json.loads(line[len(b"data: "):])["timing"]["ttft_ms"]
            if first is not None and server_ttft is not None:
                out.append((first - sent) * 1e3 - server_ttft)
            time.sleep(interval)
    return out


def _percentiles(values: list[float]) -> dict | None:
    if not values:
        return None
    v = np.array(values)
    return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
            "mean": float(v.mean()), "n": len(v)}


def one_load(url: str, qps: float, per_task: int, seed: int, model: str) -> dict:
    requests = load_workload("four-task", qps, seed, per_task)
    timing: dict[str, dict] = {}
    port = int(url.rsplit(":", 1)[1])
    span = requests[-1].arrival if requests else 0.0
    with ProcessPoolExecutor(1) as pool:
        probed = pool.submit(probe, port, model, span)
        records, duration, _ = asyncio.run(drive(url, requests, seed, False, timing=timing))
        probe_overhead = probed.result()
    overhead = []
    for r in records:
        server = timing.get(r.request.id)
        if server and r.token_times and server["ttft_ms"] is not None:
            client_ttft = (r.token_times[0] - r.dispatch_time) * 1e3
            overhead.append(client_ttft - server["ttft_ms"])
    done = [r for r in records if r.outcome.value == "finished"]
    return {"qps": qps, "requests": len(records), "finished": len(done),
            "errors": len(records) - len(done), "seconds": duration,
            "finished_per_s": len(done) / duration,
            "tokens_per_s": sum(r.num_tokens for r in done) / duration,
            "overhead_ms": _percentiles(probe_overhead),  # the gateway's (raw-socket probe)
            "load_client_overhead_ms": _percentiles(overhead)}


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
    url = f"http://127.0.0.1:{port}"
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    try:
        loads = []
        for qps in args.qps:
            per_task = max(1, round(qps * args.seconds / 4))
            loads.append(one_load(url, qps, per_task, args.seed, model))
            ld = loads[-1]
            ov, lc = ld["overhead_ms"] or {}, ld["load_client_overhead_ms"] or {}
            nan = float("nan")
            print(f"qps {qps:g}: {ld['finished']}/{ld['requests']} finished, "
                  f"{ld['finished_per_s']:.1f} req/s, {ld['tokens_per_s']:.0f} tok/s, "
                  f"TTFT overhead p50 {ov.get('p50', nan):.2f} ms p99 {ov.get('p99', nan):.2f} "
                  f"ms (load client: p50 {lc.get('p50', nan):.2f} ms)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result = {"loads": loads, "instances": args.instances, "profile": args.profile,
              "executor": "sim", "workload": "four-task"}
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
