"""``hfx bench``: drive a live server with the simulator's workloads; write the same result JSON.

Each request is sent when its Poisson arrival comes (open loop), as a streaming completion whose
prompt is a list of token ids of the workload's length (every tokenizer here accepts ids below
256), with the task's SLO in the body, its output length as ``max_tokens`` and ``ignore_eos``,
so the server does the work the simulator models. The client times every streamed token; the
records are summarised by the same code as a simulation.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import httpx
import numpy as np
from tqdm import tqdm

from hfx.records.metrics import summarize
from hfx.request import Outcome, Request, RequestRecord
from hfx.workloads.kinds import load_workload


def prompt_ids(request: Request, rng: np.random.Generator) -> list[int]:
    return rng.integers(0, 256, request.prompt_len).tolist()


async def _one(client: httpx.AsyncClient, model: str, request: Request, ids: list[int],
               t0: float, record: RequestRecord, timing: dict[str, dict] | None = None) -> None:
    clock = asyncio.get_running_loop().time
    body = {"model": model, "prompt": ids, "max_tokens": request.max_tokens, "stream": True,
            "ignore_eos": True, "task": request.task, "temperature": 0}
    if request.slo is not None:
        body["slo"] = {"ttft_ms": request.slo.ttft * 1e3, "tpot_ms": request.slo.tpot * 1e3}
    record.dispatch_time = clock() - t0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                record.outcome, record.error = Outcome.REJECTED, r.text[:300]
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    record.outcome, record.error = Outcome.FAILED, event["error"]["message"]
                    return
                if not event.get("choices"):
                    continue
                if event["choices"][0]["finish_reason"] is None:
                    record.token_times.append(clock() - t0)
                else:
                    record.outcome = Outcome.FINISHED
                    if timing is not None and "timing" in event:
                        timing[request.id] = event["timing"]
        if record.outcome is Outcome.PENDING:
            record.outcome, record.error = Outcome.FAILED, "stream ended without a finish"
    except httpx.HTTPError as e:
        record.outcome, record.error = Outcome.FAILED, f"{type(e).__name__}: {e}"
    finally:
        record.finish_time = clock() - t0


async def drive(target: str, requests: list[Request], seed: int = 0, progress: bool = True,
                timeout: float = 600.0, timing: dict[str, dict] | None = None
                ) -> tuple[list[RequestRecord], float, str]:
    """Send ``requests`` at their arrival times; returns (records, duration, model). With
    ``timing``, the server's own latency of each request is stored there by request id."""
    rng = np.random.default_rng(seed)
    # No client-side expiry either: httpcore's pool can close an expired connection it has
    # already handed to a request (encode/httpcore#1110); the server closes idle ones itself.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None,
                          keepalive_expiry=None)
    async with httpx.AsyncClient(base_url=target.rstrip("/"), timeout=timeout,
                                 limits=limits) as client:
        models = (await client.get("/v1/models")).json()["data"]
        model = models[0]["id"]
        loop = asyncio.get_running_loop()
        bar = tqdm(total=len(requests), desc="bench", unit="req", disable=not progress or None,
                   leave=False)
        records: list[RequestRecord] = []
        tasks = []
        t0 = loop.time()
        for req in requests:
            delay = t0 + req.arrival - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            # The record's arrival is when the request was sent (on the client's clock from t0).
            record = RequestRecord(replace(req, arrival=loop.time() - t0))
            records.append(record)
            task = loop.create_task(_one(client, model, req, prompt_ids(req, rng), t0, record,
                                         timing))
            task.add_done_callback(lambda _: bar.update())
            tasks.append(task)
        await asyncio.gather(*tasks)
        bar.close()
        return records, loop.time() - t0, model


def bench(target: str, workload: str, qps: float, seed: int = 0,
          requests_per_task: int = 50, progress: bool = True) -> dict:
    """The result object of ``hfx sim`` for a live server."""
    wall0 = time.perf_counter()
    requests = load_workload(workload, qps, seed, requests_per_task)
    records, duration, model = asyncio.run(drive(target, requests, seed, progress))
    return {
        "target": target, "model": model, "workload": workload, "qps": qps, "seed": seed,
        **summarize(records, [(0.0, duration)]),
        "seconds": duration, "wall_seconds": time.perf_counter() - wall0,
        "errors": sorted({r.error for r in records if r.error})[:10],
    }
