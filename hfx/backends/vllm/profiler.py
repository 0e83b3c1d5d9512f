"""Fit the step-time model (HyperFlexis Eq. 1 and Eq. 2) from running vLLM servers.

vLLM's steps cannot be timed from outside, so each grid point is timed as a client sees it,
on every server at once (servers on one host slow each other down, and serving keeps them all
busy):

- **prefill** of a batch of ``b`` prompts of ``n`` tokens: ``b`` requests with ``max_tokens=1``
  sent together, from sending to the last first token (one engine step when the batch fits the
  token budget, plus the HTTP round trip, which is what a dispatcher's TTFT prediction must
  include anyway);
- **decode** of ``b`` sequences at context ``n``: ``b`` requests sent together, each generating
  ``DECODE_TOKENS``; the step time is, per request, the time its tokens took once all ``b``
  were decoding over their number (before the last first token, steps share with prefills),
  the median over the requests.

Every prompt is fresh random token ids, so vLLM's prefix cache never shortens a prefill. Any
OpenAI-compatible server that takes token-id prompts can be measured so (``hfx profile --engine
openai``): one that streams text alone counts a token per event, and one without vLLM's
inter-token-latency histogram is timed from the client's side.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from hfx.backends.vllm.metrics import parse_metrics, vllm_client, vllm_stream
from hfx.stepmodel.fit import fit_profile
from hfx.stepmodel.latency import Profile

DECODE_TOKENS = 24


@dataclass(frozen=True, slots=True)
class VLLMGrid:
    prefill_batches: tuple[int, ...] = (1, 2, 4)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    max_prefill_tokens: int = 2048
    repeats: int = 3

    @classmethod
    def quick(cls) -> VLLMGrid:
        """About half a minute on a small CPU model: what ``hfx serve`` measures at start."""
        return cls(decode_batches=(1, 4, 16, 32), lengths=(16, 64, 256, 1024))


class _Client:
    def __init__(self, client: httpx.AsyncClient, url: str, model: str, vocab: int,
                 seed: int) -> None:
        self.client, self.url, self.model, self.vocab = client, url, model, vocab
        self.gen = np.random.default_rng(seed)

    def prompt(self, n: int) -> list[int]:
        # Ids from 1 on: a random model's ids are all valid; 0 is often padding.
        return [int(x) for x in self.gen.integers(1, self.vocab, n)]

    async def tokens(self, n: int, max_tokens: int) -> list[float]:
        """Send one request; the arrival time of each token."""
        body = {"model": self.model, "prompt": self.prompt(n), "max_tokens": max_tokens,
                "stream": True, "return_token_ids": True, "ignore_eos": True,
                "temperature": 0.0}
        times: list[float] = []
        async with vllm_stream(self.client, f"{self.url}/v1/completions",
                               json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise RuntimeError(f"vLLM: {chunk['error']}")
                    now = time.perf_counter()
                    choice = (chunk.get("choices") or [{}])[0]
                    ids = choice.get("token_ids")
                    # A server that streams text alone: a token per event that has text.
                    count = len(ids) if ids is not None else int(bool(choice.get("text")))
                    times.extend(now for _ in range(count))
        return times

    async def prefill(self, b: int, n: int) -> float:
        start = time.perf_counter()
        ends = await asyncio.gather(*(self.tokens(n, 1) for _ in range(b)))
        return max(t[0] for t in ends) - start

    async def itl(self) -> tuple[float, float]:
        """vLLM's own inter-token latency histogram: (sum of seconds, count); (0, 0) from a
        server without it."""
        response = await self.client.get(f"{self.url}/metrics")
        if response.status_code != 200:
            return 0.0, 0.0
        m = parse_metrics(response.text)
        return (m.get("vllm:inter_token_latency_seconds_sum", 0.0),
                m.get("vllm:inter_token_latency_seconds_count", 0.0))

    async def decode(self, b: int, n: int) -> float:
        """The server's own mean inter-token latency over the batch's tokens where it reports
        one (not fooled by an HTTP side that lags and sends tokens in bunches); else the
        client's view (``decode_step``)."""
        before = await self.itl()
        start = time.perf_counter()
        runs = await asyncio.gather(*(self.tokens(n, DECODE_TOKENS) for _ in range(b)))
        after = await self.itl()
        if after[1] > before[1]:
            return (after[0] - before[0]) / (after[1] - before[1])
        return decode_step(runs, start)


def decode_step(runs: list[list[float]], sent: float | None = None) -> float:
    """One decode step of a batch from its requests' token arrival times. Once the last
    request has its first token every sequence decodes (before, steps share with prefills):
    the time from a request's first chunk after that over the tokens that came later, the
    median over requests. A rate, not single gaps: the server puts several tokens in one chunk
    when its HTTP side lags the engine; they arrive together, and a chunk's tokens were made
    before it arrived, so those of the first chunk are not counted."""
    all_in = max(t[0] for t in runs)
    steps = _rates([x for x in t if x >= all_in] for t in runs)
    if not steps:  # the batch never decoded all together: each request's own rate
        steps = _rates(runs)
    if not steps and sent is not None:
        # Every request's tokens came in one chunk (the server's HTTP side could not keep up):
        # the steps are not observable, only an upper bound, from sending to the last token.
        steps = [(t[-1] - sent) / len(t) for t in runs if t]
    if not steps:
        raise RuntimeError("no decode step observable: every token came in one chunk")
    return statistics.median(steps)


def _rates(runs) -> list[float]:
    """Per request: time from its first chunk to its last over the tokens after the first."""
    out = []
    for t in runs:
        after = [x for x in t if t and x > t[0]]
        if after:
            out.append((after[-1] - t[0]) / len(after))
    return out


async def measure(urls: list[str], grid: VLLMGrid, capacity_tokens: int, seed: int = 0,
                  progress: bool = False
                  ) -> tuple[str, list[tuple[list[int], float, int]],
                             list[tuple[int, int, float]]]:
    """(served model, prefill samples, decode samples) from the servers at ``urls``, each grid
    point on all of them at once: servers that share a host slow each other down (CPU cores,
    memory bandwidth, their HTTP processes), and serving keeps them all busy, so the profile
    is taken the same way. Every server's timing is a sample."""
    async with vllm_client(httpx.Timeout(120.0)) as http:
        model = (await http.get(f"{urls[0]}/v1/models")).raise_for_status().json()["data"][0]
        # The vocabulary is not served; the byte range is safe for any real or random model.
        clients = [_Client(http, url, model["id"], 256, seed + i) for i, url in enumerate(urls)]
        await asyncio.gather(*(c.tokens(16, 2) for c in clients))  # warm-up

        async def timed(point) -> list[float]:
            """The point's median over the repeats, per server."""
            runs = [await asyncio.gather(*(point(c) for c in clients))
                    for _ in range(grid.repeats)]
            return [statistics.median(r[i] for r in runs) for i in range(len(clients))]

        prefill: list[tuple[list[int], float, int]] = []
        decode: list[tuple[int, int, float]] = []
        for n in grid.lengths:
            for b in grid.prefill_batches:
                if b * n <= grid.max_prefill_tokens:
                    for t in await timed(lambda c, b=b, n=n: c.prefill(b, n)):
                        prefill.append(([n] * b, t, 0))
            for b in grid.decode_batches:
                if b * (n + DECODE_TOKENS) > capacity_tokens // 2:  # never preempted
                    continue
                # Mean context over the measured steps: prompt plus about half the output.
                for t in await timed(lambda c, b=b, n=n: c.decode(b, n)):
                    decode.append((b, b * (n + DECODE_TOKENS // 2), t))
            if progress:
                print(f"  length {n}: {len(prefill)} prefill, {len(decode)} decode points",
                      flush=True)
    return model["id"], prefill, decode


def profile_vllm(urls: list[str], grid: VLLMGrid, capacity_tokens: int, block_size: int,
                 checkpoint: str | None = None, seed: int = 0,
                 progress: bool = False, engine: str = "vllm") -> Profile:
    """Measure the vLLM servers at ``urls`` (all at once, see ``measure``) and fit;
    ``checkpoint``'s config.json, when given, goes into the profile (P/D and the scaler read
    KV and weight sizes from it)."""
    model, prefill, decode = asyncio.run(measure(urls, grid, capacity_tokens, seed, progress))
    meta: dict = {"device": engine, "engine": engine, "servers": len(urls),
                  "grid": {"prefill_batches": list(grid.prefill_batches),
                           "decode_batches": list(grid.decode_batches),
                           "lengths": list(grid.lengths), "repeats": grid.repeats,
                           "decode_tokens": DECODE_TOKENS}}
    if checkpoint is not None:
        hf = json.loads((Path(checkpoint) / "config.json").read_text())
        meta["model"] = {"name": model, "layers": hf["num_hidden_layers"],
                         "hidden": hf["hidden_size"], "heads": hf["num_attention_heads"],
                         "kv_heads": hf.get("num_key_value_heads", hf["num_attention_heads"]),
                         "intermediate": hf["intermediate_size"], "vocab": hf["vocab_size"],
                         "tp": 1}
    return fit_profile(f"{model}@{engine}", prefill, decode, capacity_tokens, block_size, meta)
