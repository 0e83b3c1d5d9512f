"""Does a huge prompt stall other streams?

``hfx serve --executor sim`` (body limit raised to 16 MiB) streams four long completions; a
second into them, a 10 MB prompt arrives (refused once tokenized: it is far past the context
length, but it must be read and tokenized first). The longest gap between chunks of the four
streams while it is handled, against their longest gap before it, says whether the event loop
stalled: prompts over 16k characters are tokenized on a worker thread.

    python bench/serving/long_prompt_gap.py --json docs/results/long_prompt_gap.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path

import httpx

from hfx.evaluation import write_json

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import hfx_serve

BIG_BYTES = 10_000_000


async def stream(client: httpx.AsyncClient, model: str, times: list[float]) -> None:
    body = {"model": model, "prompt": "hello", "max_tokens": 400, "stream": True,
            "ignore_eos": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())


async def run(url: str, model: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        chunks: list[list[float]] = [[] for _ in range(4)]
        streams = [asyncio.ensure_future(stream(client, model, c)) for c in chunks]
        await asyncio.sleep(1.0)
        big = json.dumps({"model": model, "prompt": "word " * (BIG_BYTES // 5),
                          "max_tokens": 1}).encode()
        sent = time.perf_counter()
        r = await client.post("/v1/completions", content=big,
                              headers={"content-type": "application/json"})
        answered = time.perf_counter()
        await asyncio.gather(*streams)

    def longest_gap(lo: float, hi: float) -> float:
        gaps = [b - a for c in chunks for a, b in itertools.pairwise(c)
                if lo <= b and a <= hi]
        return max(gaps, default=0.0)

    return {"big_prompt_bytes": len(big), "big_status": r.status_code,
            "big_answer": r.json()["error"]["message"][:120],
            "big_handled_s": answered - sent,
            "longest_gap_before_ms": longest_gap(0, sent) * 1e3,
            "longest_gap_during_ms": longest_gap(sent, answered) * 1e3,
            "chunks_during": sum(sent <= t <= answered for c in chunks for t in c)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with hfx_serve("--executor", "sim", "--instances", "2", "--max-body-bytes",
                   str(16 << 20)) as live:
        result = {"command": "python bench/serving/long_prompt_gap.py " + " ".join(sys.argv[1:]),
                  **asyncio.run(run(live.url, live.model))}
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
