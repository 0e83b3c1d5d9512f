"""A Mooncake-format trace of multi-turn sessions on a few applications (issue 46).

Each session is a conversation of ``chat-sessions`` (hfx/workloads/sessions.py: ShareGPT's turns
and lengths, Mooncake's gaps between turns) that opens with the system prompt of one of
``--apps`` applications (their lengths and Zipf popularity as ``shared-prompts``'); each turn's
prompt is the system prompt, the whole history and a new user message. Sessions begin as a
Poisson process at the rate that makes ``--qps`` requests per second on average, and every turn
of every session is written, in arrival order, as Mooncake writes its traces: ``timestamp``
(ms), ``input_length``, ``output_length``, ``hash_ids`` (one per 512-token block of the prompt,
the last maybe partial; ids numbered in order of first appearance, as Mooncake's are).

It prints, as JSON, the share of prompt blocks whose whole prefix appeared in an earlier row of
the trace (``repeat_share``: the most an infinite prefix cache could hit replaying it; answers
are not in a Mooncake row, so a turn finds only what earlier prompts held), and the same share
counted at the generator's 16-token blocks with answers cached
(``repeat_share_16_with_answers``). The trace is read back through ``read_trace`` first.

    python bench/sim/make_session_trace.py --sessions 2000 --qps 2 --seed 0 \\
        --out /tmp/sessions_trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

from hfx.request import Request
from hfx.workloads.sessions import (
    HASH_BLOCK,
    SHAPES,
    Shape,
    draw_rows,
    repeat_share,
    to_requests,
)
from hfx.workloads.traces import MOONCAKE_BLOCK, parse_slo_map, read_trace

SESSIONS_TAG = 4  # keeps these sessions' generators and hashes apart from the kinds' own
APPS = 8  # applications (our choice)
# Mean system prompt tokens (our choice: with it 81% of the trace's prompt blocks repeat, as in the
# trace issue 46 describes; shared-prompts' own are Mooncake's 5,072, and give 90%).
SYSTEM_MEAN = 2000.0


def session_shape(apps: int, system_tokens: float) -> Shape:
    """chat-sessions' conversations, each opening with one of ``apps`` system prompts of
    ``system_tokens`` tokens on average (std half the mean, as shared-prompts')."""
    return replace(SHAPES["chat-sessions"], tag=SESSIONS_TAG, apps=apps,
                   system=(system_tokens, system_tokens / 2))


def mooncake_rows(requests: list[Request]) -> list[dict]:
    """Mooncake's rows for ``requests`` (hashed at 512 tokens): each prompt's hash ids,
    renumbered 0, 1, ... in order of first appearance."""
    ids: dict[int, int] = {}
    rows = []
    for r in requests:
        assert r.block_hashes is not None and r.hash_block == MOONCAKE_BLOCK
        prompt = r.block_hashes[:math.ceil(r.prompt_len / MOONCAKE_BLOCK)]
        rows.append({"timestamp": round(r.arrival * 1000), "input_length": r.prompt_len,
                     "output_length": r.max_tokens,
                     "hash_ids": [ids.setdefault(h, len(ids)) for h in prompt]})
    return rows


def make(sessions: int, qps: float, seed: int, apps: int = APPS,
         system_tokens: float = SYSTEM_MEAN) -> tuple[list[dict], float, float]:
    """The trace's rows; the repeat share of its sessions hashed at 16 tokens with their
    answers (what the same sessions offer a cache as a workload of requests); and when the
    last session starts, in seconds after the first request."""
    shape = session_shape(apps, system_tokens)
    rows = draw_rows(shape, qps, seed, units=sessions)
    at_512 = to_requests("session", rows, seed, shape.tag, MOONCAKE_BLOCK)
    at_16 = to_requests("session", rows, seed, shape.tag, HASH_BLOCK)
    last_start = float(rows.arrival[rows.step == 0].max() - rows.arrival[0])
    return mooncake_rows(at_512), repeat_share(at_16), last_start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=2000, help="conversations (default 2000)")
    ap.add_argument("--qps", type=float, default=2.0, help="mean requests per second (2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--apps", type=int, default=APPS, help=f"applications ({APPS})")
    ap.add_argument("--system-tokens", type=float, default=SYSTEM_MEAN,
                    help=f"mean system prompt tokens ({SYSTEM_MEAN:.0f})")
    ap.add_argument("--out", type=Path, required=True, help="the trace to write (.jsonl)")
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.apps < 1 or args.system_tokens <= 0:
        ap.error("--sessions, --apps and --system-tokens must be positive")
    rows, share_16, last_start = make(args.sessions, args.qps, args.seed, args.apps,
                                      args.system_tokens)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    requests = read_trace(args.out, "mooncake", parse_slo_map("default=2000:500"))
    # Sessions start until ``last_start``; their later turns trail after it: the rate is --qps
    # while sessions start, and falls as the last ones end.
    json.dump({"out": str(args.out), "sessions": args.sessions, "apps": args.apps,
               "seed": args.seed, "requests": len(requests),
               "span_s": round(requests[-1].arrival, 1),
               "qps_while_sessions_start": round(
                   sum(r.arrival < last_start for r in requests) / last_start, 3)
               if last_start > 0 else None,
               "mean_input": round(sum(r.prompt_len for r in requests) / len(requests), 1),
               "mean_output": round(sum(r.max_tokens for r in requests) / len(requests), 1),
               "repeat_share": round(repeat_share(requests), 4),
               "repeat_share_16_with_answers": round(share_16, 4)}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
