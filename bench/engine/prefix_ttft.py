"""A prompt whose prefix is cached starts its first token in the time of its uncached part: the
real engine (TorchExecutor, random weights, CPU) against the step-time model's prediction.
Writes JSON; not a test.

For each cached length k and new length c: a request of k shared tokens and a tail is served
first (its prompt's full blocks stay cached), then, alone on the idle engine, requests of the
same k tokens and c new ones; each one's TTFT (its submission to its first token, on the
ordinary loop) is measured, and predicted by the profile as c tokens over k cached
(``prefill_time(c, c·(k + c), c·k)``: Eq. 1 and the cached prefix's own term, ``prefill_e``),
and, for scale, as the whole prompt (``prefill_one(k + c)``, what a model that knows no cache
predicts). The profile is ``hfx profile``'s quick grid with its prefix-hit points, measured
first (or ``--profile``).

    python bench/engine/prefix_ttft.py --json docs/data/prefix_cache/engine_ttft.json
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time

import numpy as np
import torch

from hfx.engine.config import EngineConfig
from hfx.engine.profiler import Grid, profile_model
from hfx.engine.sequence import Sequence
from hfx.engine.torch_executor import real_engine
from hfx.evaluation import write_json
from hfx.model.build import build_model
from hfx.stepmodel.latency import load_profile

CACHED = (0, 256, 512, 1024, 1536)
NEW = (32, 128, 512)
BLOCK = 16


async def ttft(engine, seq: Sequence) -> float:
    """Seconds from submission to the first token, stepping the engine alone."""
    start = time.perf_counter()
    engine.add_request(seq)
    while not seq.output_token_ids:
        await engine.step()
    took = time.perf_counter() - start
    while engine.has_work():
        await engine.step()
    return took


async def measure(engine, vocab: int, repeats: int, seed: int) -> list[dict]:
    gen = np.random.default_rng(seed)
    rows = []
    n = 0
    for k in CACHED:
        shared = gen.integers(0, vocab, k).tolist()
        # Warm the cache with the shared part (and a tail of its own).
        await ttft(engine, Sequence(f"warm{k}", k + 16, 1,
                                    prompt_token_ids=shared + gen.integers(0, vocab, 16).tolist()))
        for c in NEW:
            times, cached = [], []
            for _ in range(repeats):
                n += 1
                s = Sequence(f"r{n}", k + c, 1,
                             prompt_token_ids=shared + gen.integers(0, vocab, c).tolist())
                times.append(await ttft(engine, s))
                cached.append(s.num_cached_tokens)
            rows.append({"cached": k, "new": c, "ttft": times,
                         "ttft_median": statistics.median(times),
                         "cached_tokens": cached})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--profile", default=None, help="a profile to predict with (default: "
                    "measure the quick grid first)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    loaded = build_model(args.shape, device="cpu")
    profile = load_profile(args.profile) if args.profile else profile_model(
        loaded, Grid.quick(), capacity_tokens=65536, block_size=BLOCK, progress=True)
    model = profile.model
    engine = real_engine(loaded.model, EngineConfig(num_kv_blocks=4096, block_size=BLOCK,
                                                    planner="prefill-first"), threaded=True)
    rows = asyncio.run(measure(engine, loaded.model.shape.vocab_size, args.repeats, args.seed))
    for r in rows:
        k, c = r["cached"], r["new"]
        r["predicted"] = model.prefill_time(c, c * (k + c), c * k)
        r["predicted_uncached"] = model.prefill_one(k + c)
        r["error"] = r["predicted"] / r["ttft_median"] - 1
        r["error_uncached"] = r["predicted_uncached"] / r["ttft_median"] - 1
        print(f"cached {k:5d} new {c:4d}: TTFT {r['ttft_median'] * 1e3:7.2f} ms, predicted "
              f"{r['predicted'] * 1e3:7.2f} ms ({r['error']:+.0%}); as a whole prompt "
              f"{r['predicted_uncached'] * 1e3:7.2f} ms ({r['error_uncached']:+.0%}); found "
              f"cached {min(r['cached_tokens'])}")
    hits = [r for r in rows if r["cached"]]
    out = {"command": "python bench/engine/prefix_ttft.py " + " ".join(sys.argv[1:]),
           "python": platform.python_version(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "profile": profile.name,
           "coefficients": profile.to_json()["prefill"],
           "fit_mape": profile.fit_mape, "rows": rows,
           "mean_abs_error_hits": statistics.fmean(abs(r["error"]) for r in hits),
           "mean_abs_error_hits_as_whole": statistics.fmean(abs(r["error_uncached"])
                                                            for r in hits)}
    print(f"mean |error| with hits: {out['mean_abs_error_hits']:.1%} (the model that knows no "
          f"cache: {out['mean_abs_error_hits_as_whole']:.1%})")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
