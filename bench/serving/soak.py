"""A bounded loopback soak of ``hfx serve``: mixed traffic for minutes, then the books.

``hfx serve --executor sim`` runs as a subprocess (8 instances by default, at the shipped
llama-3-70b@ascend-910b profile's speed) with admission control on. An open-loop client sends
Poisson arrivals through phases of rising then falling rate — the busiest past the fleet's
capacity, so that load is shed — with a mix of:

- valid requests, streaming or not, over the four-task classes (``task``);
- invalid ones (NaN, a seed out of range, an unknown task, an empty prompt, a bad model, JSON
  that does not parse);
- clients that go away: a stream dropped after its first chunk, a non-streaming request whose
  client times out;
- oversized bodies (past ``--max-body-bytes``), and prompts past the context length.

Reported: client-side answers by kind and status, the 5xx count (goal 0), the server's own
request counts by outcome, the server's RSS (after the first phase, at the end, the peak), and
the gauges once the traffic stops (queue, in flight, sequences, KV: all back to 0).

    python bench/serving/soak.py --json docs/results/soak.json            # 5 minutes
    python bench/serving/soak.py --phase-seconds 5 --json /tmp/soak.json  # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import time
from pathlib import Path

import httpx

from hfx.evaluation import write_json

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import hfx_serve, scrape

RATES = (10.0, 40.0, 80.0, 160.0, 10.0)  # requests/s per phase; 160 is past 8 instances
TASKS = ("medical_qa", "tldr_content_gen", "tldr_headline_gen", "wikisql")
MAX_BODY = 256 << 10
MAX_MODEL_LEN = 4096
# The mix: kind → share of arrivals.
MIX = {"valid": 0.62, "invalid": 0.14, "drop_stream": 0.08, "client_timeout": 0.06,
       "oversized": 0.05, "too_long": 0.05}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_call(kind: str, rng: random.Random, model: str) -> tuple[dict | bytes, bool, float]:
    """(body, stream, client timeout) for one arrival of ``kind``."""
    task = rng.choice(TASKS)
    stream = rng.random() < 0.5
    body: dict = {"model": model, "prompt": "word " * rng.randint(8, 400),
                  "max_tokens": rng.randint(4, 48), "task": task, "stream": stream,
                  "ignore_eos": True}
    if kind == "invalid":
        bad = rng.choice(["nan", "seed", "task", "empty", "model", "json", "slo"])
        if bad == "json":
            return b'{"model": "' + model.encode() + b'", "prompt": ', False, 30.0
        body |= {"nan": {"temperature": float("nan")}, "seed": {"seed": 2**64},
                 "task": {"task": "unknown"}, "empty": {"prompt": ""},
                 "model": {"model": "other"},
                 "slo": {"slo": {"ttft_ms": float("inf"), "tpot_ms": 1}}}[bad]
    elif kind == "drop_stream":
        body |= {"stream": True, "max_tokens": 400}
    elif kind == "client_timeout":
        body |= {"stream": False, "max_tokens": 400}
        return body, False, 0.3
    elif kind == "oversized":
        body["prompt"] = "x" * (MAX_BODY + 1024)
    elif kind == "too_long":
        body["prompt"] = "word " * (MAX_MODEL_LEN + 100)
    return body, body["stream"], 60.0


async def one(client: httpx.AsyncClient, kind: str, rng: random.Random, model: str,
              tally: collections.Counter) -> None:
    body, stream, timeout = make_call(kind, rng, model)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        async with client.stream("POST", "/v1/completions", content=content, timeout=timeout,
                                 headers={"content-type": "application/json"}) as r:
            if stream and r.status_code == 200:
                async for line in r.aiter_lines():
                    if kind == "drop_stream" and line.startswith("data: "):
                        break  # the client goes away mid-stream
                    if line.startswith("data: {") and '"error"' in line[:20]:
                        tally[kind, "stream_error"] += 1
            else:
                await r.aread()
            tally[kind, str(r.status_code)] += 1
    except httpx.TimeoutException:
        tally[kind, "client_timeout"] += 1
    except httpx.HTTPError as e:
        tally[kind, f"transport:{type(e).__name__}"] += 1


async def traffic(url: str, model: str, phase_seconds: float, seed: int,
                  rss: list[tuple[float, float]], pid: int) -> collections.Counter:
    rng = random.Random(seed)
    tally: collections.Counter = collections.Counter()
    kinds, weights = list(MIX), list(MIX.values())
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    tasks: set[asyncio.Task] = set()
    async with httpx.AsyncClient(base_url=url, limits=limits) as client:
        loop = asyncio.get_running_loop()
        for rate in RATES:
            end = loop.time() + phase_seconds
            while (now := loop.time()) < end:
                await asyncio.sleep(rng.expovariate(rate))
                task = asyncio.ensure_future(one(client, rng.choices(kinds, weights)[0],
                                                 random.Random(rng.random()), model, tally))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            rss.append((now, rss_mb(pid)))
            print(f"phase {rate:g}/s done: {sum(tally.values())} answered, "
                  f"{len(tasks)} open, RSS {rss[-1][1]:.0f} MB", flush=True)
        await asyncio.gather(*tasks)
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase-seconds", type=float, default=60.0,
                    help=f"seconds per phase; the rates are {RATES} requests/s")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--profile", default="llama-3-70b@ascend-910b",
                    help="the sim executor's step times: a slow model, so that the busy phases "
                    "overload 8 instances and admission control sheds (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args()

    serve_args = ["--executor", "sim", "--instances", str(args.instances), "--profile",
                  args.profile, "--max-body-bytes", str(MAX_BODY), "--max-model-len",
                  str(MAX_MODEL_LEN), "--max-queued", "256", "--max-wait", "5"]
    with hfx_serve(*serve_args) as live:
        server, url, model = live.process, live.url, live.model
        rss: list[tuple[float, float]] = [(0.0, rss_mb(server.pid))]
        t0 = time.monotonic()
        tally = asyncio.run(traffic(url, model, args.phase_seconds, args.seed, rss,
                                    server.pid))
        wall = time.monotonic() - t0
        settle = time.monotonic() + 60
        gauges = {}
        while time.monotonic() < settle:
            m = scrape(url)
            gauges = {name: sum(v for (n, _), v in m.items() if n == name)
                      for name in ("hfx_queued_requests", "hfx_in_flight_requests",
                                   "hfx_instance_running", "hfx_instance_waiting",
                                   "hfx_instance_kv_usage")}
            if not any(gauges.values()):
                break
            time.sleep(0.5)
        outcomes = collections.Counter()
        for (name, labels), v in m.items():
            if name == "hfx_requests_total":
                outcomes[dict(labels)["outcome"]] += int(v)
        rss.append((time.monotonic() - t0, rss_mb(server.pid)))
        alive = server.poll() is None
    by_kind: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (kind, status), n in sorted(tally.items()):
        by_kind[kind][status] = n
    five_xx = sum(n for (_, status), n in tally.items()
                  if status.isdigit() and int(status) >= 500 and int(status) not in (503,))
    report = {
        "command": "python bench/serving/soak.py " + " ".join(sys.argv[1:]),
        "server": "hfx serve " + " ".join(serve_args),
        "rates_rps": list(RATES), "phase_seconds": args.phase_seconds,
        "wall_seconds": round(wall, 1), "requests": sum(tally.values()),
        "client_answers": by_kind,
        "server_outcomes": dict(outcomes),
        "5xx_other_than_503": five_xx,
        "503": sum(n for (_, s), n in tally.items() if s == "503"),
        "rss_mb": {"start": round(rss[0][1], 1), "after_first_phase": round(rss[1][1], 1),
                   "end": round(rss[-1][1], 1), "peak": round(max(r for _, r in rss), 1)},
        "gauges_after": gauges,
        "server_alive": alive,
        "server_exit_code": server.returncode,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        write_json(args.json, report)
    return 0 if five_xx == 0 and alive and not any(gauges.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
