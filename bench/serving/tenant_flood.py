"""A flood from one tenant against a live ``hfx serve`` (issue 50), fair shares off and on.

``hfx serve --executor sim`` (one instance of 16 sequences unless ``--max-num-seqs``, at
qwen2.5-7b@ascend-910b's speed) as a subprocess. A modest tenant (``x-tenant: modest``) sends a
30-token streamed request every half second; in the flood runs another tenant (``x-tenant:
flood``) keeps 192 connections busy with the same requests. Four runs: the modest tenant
alone; with the flood, ``--fair-share off``; with the flood, ``--fair-share class`` (the
default) with no sequence kept for the modest tenant (``--fair-reserve 0``) and with one (the
default); ``--repeats`` runs each setting that many times, interleaved. Reported per run and
as means: the modest tenant's median and p90 TTFT (the server's, from the stream's last chunk),
its answers by status, its SLO attainment (the server's ``hfx_tenant_slo_total``), the flood's
requests served and refused, and the goodput (both tenants' requests that met their SLO, per
second).

    python bench/serving/tenant_flood.py --repeats 3 --json docs/data/tenants/live.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hfx.evaluation import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import hfx_serve, scrape

PROMPT = "summarise the meeting notes of the week in a few words"


async def one(client: httpx.AsyncClient, model: str, tenant: str, tokens: int
              ) -> tuple[int, float | None]:
    """(status, its TTFT in seconds as the server measured it: the load generator shares
    the machine, so a client-side clock would time its own event loop)."""
    try:
        async with client.stream("POST", "/v1/completions", headers={"x-tenant": tenant},
                                 json={"model": model, "prompt": PROMPT, "max_tokens": tokens,
                                       "stream": True, "ignore_eos": True}) as r:
            if r.status_code != 200:
                await r.aread()
                return r.status_code, None
            ttft = None
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"timing"' in line:
                    timing = json.loads(line[6:]).get("timing") or {}
                    if timing.get("ttft_ms") is not None:
                        ttft = timing["ttft_ms"] / 1e3
            return 200, ttft
    except httpx.HTTPError:
        return -1, None


async def drive(url: str, model: str, seconds: float, flood: int, tokens: int) -> dict:
    limits = httpx.Limits(max_connections=flood + 64, max_keepalive_connections=flood + 64)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        stop = time.monotonic() + seconds
        flood_status: collections.Counter[int] = collections.Counter()

        async def flooder() -> None:
            while time.monotonic() < stop:
                status, _ = await one(client, model, "flood", tokens)
                flood_status[status] += 1
                if status != 200:
                    await asyncio.sleep(0.05)  # a refused client backs off a little

        floods = [asyncio.ensure_future(flooder()) for _ in range(flood)]
        modest: list[asyncio.Future[tuple[int, float | None]]] = []
        while time.monotonic() < stop:
            modest.append(asyncio.ensure_future(one(client, model, "modest", tokens)))
            await asyncio.sleep(0.5)
        results = await asyncio.gather(*modest)
        await asyncio.gather(*floods)
    ttfts = sorted(t for s, t in results if s == 200 and t is not None)
    return {"modest_requests": len(results),
            "modest_status": dict(collections.Counter(s for s, _ in results)),
            "modest_median_ttft": statistics.median(ttfts) if ttfts else None,
            "modest_p90_ttft": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None,
            "flood_status": dict(flood_status)}


SETTINGS = (("alone", False, "class", 1), ("flood, fair off", True, "off", 1),
            ("flood, fair class, no reserve", True, "class", 0),
            ("flood, fair class", True, "class", 1))
MEANS = ("modest_median_ttft", "modest_p90_ttft", "modest_attainment", "goodput")


def one_run(flood: int, fair: str, reserve: int, args: argparse.Namespace) -> dict:
    with hfx_serve("--executor", "sim", "--instances", "1",
                   "--max-num-seqs", str(args.max_num_seqs),
                   "--fair-share", fair, "--fair-reserve", str(reserve)) as live:
        run = asyncio.run(drive(live.url, live.model, args.seconds, flood, args.tokens))
        samples = scrape(live.url)
    slo = {(tenant, result): samples.get(("hfx_tenant_slo_total",
                                          (("result", result), ("tenant", tenant))), 0.0)
           for tenant in ("modest", "flood") for result in ("met", "missed")}
    total = slo["modest", "met"] + slo["modest", "missed"]
    run["modest_attainment"] = slo["modest", "met"] / total if total else None
    # Goodput: requests that met their SLO, both tenants, per second of the run.
    run["goodput"] = (slo["modest", "met"] + slo["flood", "met"]) / args.seconds
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--flood", type=int, default=192, help="the flood's connections")
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--max-num-seqs", type=int, default=16, help="the instance's sequences")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each setting, interleaved (the means are reported)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name, *_ in SETTINGS}
    for _ in range(args.repeats):
        for name, flooded, fair, reserve in SETTINGS:
            run = one_run(args.flood if flooded else 0, fair, reserve, args)
            runs[name].append(run)
            print(name, run)
    means = {name: {k: statistics.fmean(r[k] for r in rs) if all(r[k] is not None for r in rs)
                    else None for k in MEANS} for name, rs in runs.items()}
    alone = means["alone"]["modest_median_ttft"]
    off = means["flood, fair off"]["goodput"]
    result = {"command": "python bench/serving/tenant_flood.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json"),
              "commit": subprocess.run(["git", "describe", "--always", "--dirty"],
                                       capture_output=True, text=True).stdout.strip(),
              "runs": runs, "means": means,
              "median_ttft_vs_alone": {k: (m["modest_median_ttft"] or 0) / alone
                                       for k, m in means.items()} if alone else None,
              "goodput_vs_fair_off": {k: m["goodput"] / off for k, m in means.items()}
              if off else None}
    print(json.dumps({k: result[k] for k in ("means", "median_ttft_vs_alone",
                                              "goodput_vs_fair_off")}, indent=1))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
