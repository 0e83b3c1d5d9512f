"""Decode steps whose contexts are far apart, on the real engine's executor: attended in groups
of similar context (``TorchExecutor``'s default) against one batch padded to the longest
context. Writes JSON; not a test.

    python bench/engine/decode_padding.py --json docs/data/decode_padding.json
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics

import numpy as np
import torch

from hfx.engine.block_manager import BlockManager
from hfx.engine.planners.base import SchedulerOutput
from hfx.engine.profiler import step_times
from hfx.engine.sequence import Sequence
from hfx.engine.torch_executor import DECODE_GROUP_SPREAD, TorchExecutor
from hfx.evaluation import write_json
from hfx.model.build import build_model

# (label, contexts): even contexts, and the same Σ with one long context among short ones
# (a wikisql prompt beside short chat turns, as four-task makes).
BATCHES = (("8 even", [225] * 8), ("8: one long", [1000] + [114] * 7),
           ("16 even", [125] * 16), ("16: one long", [1000] + [66] * 15))


def step(contexts: list[int], vocab: int, gen: np.random.Generator) -> SchedulerOutput:
    kv, out = BlockManager(8192, 16), SchedulerOutput()
    for i, n in enumerate(contexts):
        seq = Sequence(f"d{i}", n, 8, prompt_token_ids=gen.integers(0, vocab, n).tolist(),
                       output_token_ids=[1], num_computed_tokens=n)
        kv.allocate(seq, n + 2)
        out.schedule(seq, 1)
    return out


async def measure(executor: TorchExecutor, repeats: int) -> list[dict]:
    gen = np.random.default_rng(0)
    rows = []
    for label, contexts in BATCHES:
        out = step(contexts, executor.vocab_size, gen)
        row = {"batch": label, "sum_context": sum(contexts), "max_context": max(contexts)}
        for name, spread in (("grouped", DECODE_GROUP_SPREAD), ("padded", float("inf"))):
            executor.decode_group_spread = spread
            row[f"{name}_ms"] = 1e3 * statistics.fmean(await step_times(executor, out,
                                                                         repeats, 0.5))
        rows.append(row)
        print(f"{label:14s} Σ {row['sum_context']:5d}  grouped {row['grouped_ms']:6.2f} ms  "
              f"padded {row['padded_ms']:6.2f} ms")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="mini")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loaded = build_model(args.shape, device="cpu")
    executor = TorchExecutor(loaded.model, 8192, 16)
    rows = asyncio.run(measure(executor, args.repeats))
    if args.json:
        write_json(args.json, {"shape": args.shape, "threads": 1, "torch": torch.__version__,
                               "machine": platform.machine(), "rows": rows})


if __name__ == "__main__":
    main()
