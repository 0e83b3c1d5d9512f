"""The faulty mix of issue 50 against ``hfx serve --engine vllm``: healthy streams beside
requests that meet an upstream fault on every server, with 2 and 4 upstreams and 1 and 2 front
processes, colocated and P/D (half the upstreams prefill, half decode), the servers given by
``--backend`` or started by HFX itself.

The upstreams are bench/serving/fake_upstream.py with ``--faults`` (a prompt starting with
``# $ % & *`` meets a dropped connection, a malformed event, a 500, an end without a finish
reason, or silence). Started servers (``--servers started``): HFX starts each as it starts vLLM
(``python -m vllm.entrypoints.openai.api_server`` under ``--vllm-python``, with the flags it
gives vLLM, health-polled, stopped at the end), the interpreter given being a wrapper under
which that module is the fake upstream. Per grid cell one burst: ``--healthy`` 64-token streams
and ``--faulty`` requests, all at once, then ``--after`` healthy ones once the burst is over.
Reported per cell: healthy streams finished whole, faulty requests and how they ended (status,
time), the least number of instances taking work seen while the burst ran (sampled from
``/metrics`` every 50 ms) against the fleet less its allowed ejected share, ejections, and the
gauges once it is over (queued and in flight: 0).

    python bench/serving/fault_mix.py --json docs/data/faults/fault_mix.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from hfx.backends.vllm.process import free_port
from hfx.cluster.outliers import EjectionPolicy
from hfx.evaluation import write_json
from hfx.model.build import write_random_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import hfx_serve, scrape, stand_in_vllm_python

FAULTY_PREFIXES = "#$%&*"
TOKENS = 64
IDLE_TIMEOUT = 1.0  # --upstream-idle-timeout: how long a stall takes to count as a fault


@contextlib.contextmanager
def upstreams(n: int) -> Iterator[list[str]]:
    """``n`` fake vLLM servers with faults on cue; their URLs."""
    ports = [free_port() for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_upstream.py")),
                               "--port", str(p), "--faults", "--tick-ms", "10",
                               "--tokens-per-tick", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"fake upstream {url} did not start")
                time.sleep(0.1)
        yield urls
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


# ``python -m vllm.entrypoints.openai.api_server`` as the fake upstream with faults on cue.
SHIM = """import argparse
from fake_upstream import main, run
ap = argparse.ArgumentParser()
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--served-model-name", default="fake")
a, _ = ap.parse_known_args()  # vLLM's other flags, which HFX passes, are not the fake's
run(main(argparse.Namespace(host=a.host, port=a.port, model=a.served_model_name,
                            tokens_per_tick=1, tick_ms=10.0, token_id=1234, text=" tok",
                            faults=True)))
"""


def accepting(url: str) -> int:
    samples = scrape(url)
    return int(sum(v for (name, labels), v in samples.items()
                   if name == "hfx_instances" and ("state", "active") in labels))


async def burst(url: str, model: str, healthy: int, faulty: int) -> tuple[list[dict], list[int]]:
    prompts = ([f"{FAULTY_PREFIXES[i % len(FAULTY_PREFIXES)]}bad request {i}"
                for i in range(faulty)] + [f"healthy request {i}" for i in range(healthy)])
    seen: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(httpx.HTTPError):
                seen.append(await asyncio.to_thread(accepting, url))
            await asyncio.sleep(0.05)

    limits = httpx.Limits(max_keepalive_connections=0)  # new connections: every front
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def one(prompt: str) -> dict:
            t0 = time.monotonic()
            r = await client.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": TOKENS, "ignore_eos": True})
            body = r.json()
            return {"healthy": prompt.startswith("healthy"), "status": r.status_code,
                    "seconds": time.monotonic() - t0,
                    "tokens": body.get("usage", {}).get("completion_tokens"),
                    "error": body.get("error", {}).get("message")}

        watcher = asyncio.ensure_future(watch())
        results = await asyncio.gather(*(one(p) for p in prompts))
        done.set()
        await watcher
    return results, seen


@contextlib.contextmanager
def servers(kind: str, n: int, mode: str, python: str) -> Iterator[list[str]]:
    """``hfx serve``'s arguments for ``n`` faulty servers: ``--backend`` URLs of upstreams
    running here, or the fake started by HFX (``--vllm-python``)."""
    if kind == "started":
        yield (["--vllm-python", python] if mode == "pd" else
               ["--vllm-python", python, "--instances", str(n)])
        return
    with upstreams(n) as urls:
        yield [a for u in urls for a in ("--backend", u)]


def cell(checkpoint: str, n: int, fronts: int, mode: str, kind: str, python: str,
         args: argparse.Namespace) -> dict:
    # P/D: the first half of the upstreams prefill, the rest decode.
    roles = ([] if mode == "colocated" else
             ["--mode", "pd", "--prefill", str(n // 2), "--decode", str(n - n // 2)])
    with servers(kind, n, mode, python) as given, hfx_serve(
            "--engine", "vllm", "--checkpoint", checkpoint, "--profile", "tiny@cpu",
            "--max-model-len", "2048", "--policy", "rr", "--calibrate-every", "0",
            "--upstream-idle-timeout", str(IDLE_TIMEOUT), "--api-workers", str(fronts),
            *roles, *given, start_timeout=120.0) as live:
        results, seen = asyncio.run(burst(live.url, live.model, args.healthy, args.faulty))
        after, _ = asyncio.run(burst(live.url, live.model, args.after, 0))
        time.sleep(0.5)
        samples = scrape(live.url)
    healthy = [r for r in results if r["healthy"]]
    faulty = [r for r in results if not r["healthy"]]
    policy = EjectionPolicy()
    floor = n - policy.allowed(n)
    ejections = sum(v for (name, _), v in samples.items() if name == "hfx_ejections_total")
    return {
        "mode": mode, "servers": kind, "upstreams": n, "fronts": fronts,
        "healthy_whole": sum(r["status"] == 200 and r["tokens"] == TOKENS for r in healthy),
        "healthy": len(healthy),
        "faulty_ended_with_error": sum(r["status"] != 200 and bool(r["error"]) for r in faulty),
        "faulty": len(faulty),
        "faulty_no_instance_errors": sum("no instance can serve" in (r["error"] or "")
                                         for r in faulty),
        "faulty_longest_seconds": max((r["seconds"] for r in faulty), default=0.0),
        "faulty_statuses": sorted({r["status"] for r in faulty}),
        "least_accepting_seen": min(seen) if seen else None, "allowed_floor": floor,
        "ejections": ejections,
        "after_whole": sum(r["status"] == 200 and r["tokens"] == TOKENS for r in after),
        "after": len(after),
        "queued_after": samples.get(("hfx_queued_requests", ()), None),
        "in_flight_after": samples.get(("hfx_in_flight_requests", ()), None),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstreams", default="2,4")
    ap.add_argument("--fronts", default="1,2")
    ap.add_argument("--modes", default="colocated,pd", help="colocated and/or pd (half the "
                    "upstreams prefill, half decode)")
    ap.add_argument("--servers", default="backend,started", help="backend (--backend URLs) "
                    "and/or started (HFX starts them, as it starts vLLM)")
    ap.add_argument("--healthy", type=int, default=20)
    ap.add_argument("--faulty", type=int, default=10)
    ap.add_argument("--after", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cells = []
    with tempfile.TemporaryDirectory() as d:
        checkpoint = str(write_random_checkpoint("tiny", Path(d)))
        python = stand_in_vllm_python(Path(d) / "fake-vllm", SHIM, [str(Path(__file__).parent)])
        for kind in args.servers.split(","):
            for mode in args.modes.split(","):
                for n in (int(x) for x in args.upstreams.split(",")):
                    for fronts in (int(x) for x in args.fronts.split(",")):
                        result = cell(checkpoint, n, fronts, mode, kind, python, args)
                        print(json.dumps(result))
                        cells.append(result)
    out = {"command": "python bench/serving/fault_mix.py " + " ".join(
               f"--{k} {v}" for k, v in vars(args).items() if k != "json"),
           "commit": subprocess.run(["git", "describe", "--always", "--dirty"],
                                    capture_output=True, text=True).stdout.strip(),
           "cells": cells}
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
