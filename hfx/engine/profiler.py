"""``hfx profile``: measure a real executor on the seed's grid and fit the step-time model.

HyperFlexis Appendix A profiles batch sizes 1, 2, …, 192 and input lengths 4, …, 2020 and fits Eq. 1
and Eq. 2 by least squares on the relative error. Here each grid point is one step built by hand
(prefill: β prompts of length l; decode: β sequences at context l) and timed on the executor:
the mean of a few repeats after a warm-up (the mean, not the median, because the simulator must
get sums of step times right and this machine's timing noise is skewed). Points run in a
shuffled order so that drift in the machine's speed does not line up with the grid. Every fourth
point is held out of the fit and reported separately (``fit_mape``: ``prefill``/``decode`` on the
fitted points, ``*_heldout`` on the rest), so the error says how well the model predicts steps
it has not seen.

``--quick`` keeps the points a CPU runs in about a minute for the tiny shape: prefill batches up
to 4, decode batches up to 64, the seed's lengths up to 1024 (plus 384), at most 2,048 tokens
per prefill step.

Prefix-cache hits (issue 46): a prompt whose first k tokens are cached computes its other c over
them, which Eq. 1 charges as c and c·(k + c), and the prefix's own term as c·k
(BatchShape.add_prefill, StepTimeModel.prefill_e). Grid points of that form (``h``: β chunks of
c tokens over k cached each, for the cached lengths ``cached``) are timed and fitted with the
whole prompts, so the attention over a cached prefix gets its own coefficient.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from hfx.engine.block_manager import BlockManager
from hfx.engine.planners.base import SchedulerOutput
from hfx.engine.sequence import Sequence
from hfx.engine.torch_executor import TorchExecutor
from hfx.model.build import LoadedModel
from hfx.model.shapes import ModelShape
from hfx.stepmodel.fit import PrefillSample, Samples, fit_profile
from hfx.stepmodel.latency import Profile
from hfx.stepmodel.roofline import GRID_BATCH, GRID_LENGTH

MIN_SECONDS = 0.2  # of timed runs per grid point


@dataclass(frozen=True, slots=True)
class Grid:
    prefill_batches: tuple[int, ...]
    decode_batches: tuple[int, ...]
    lengths: tuple[int, ...]
    max_prefill_tokens: int
    repeats: int
    # Tokens found cached before a chunk, for the prefix-hit points (chunks of ``lengths``,
    # batches of ``prefill_batches``); none: whole prompts only.
    cached: tuple[int, ...] = ()

    @classmethod
    def full(cls) -> Grid:
        """HyperFlexis Appendix A, prefill steps capped at 16,384 tokens (as the roofline's)."""
        return cls(GRID_BATCH, GRID_BATCH, GRID_LENGTH, 16384, 3, (256, 1024, 4096))

    @classmethod
    def quick(cls) -> Grid:
        return cls((1, 2, 4), (1, 2, 4, 8, 16, 32, 64),
                   (4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024), 2048, 5,
                   (256, 1024))


async def step_times(executor: TorchExecutor, out: SchedulerOutput, repeats: int,
                     min_seconds: float = 0.0) -> list[float]:
    """Seconds of each of at least ``repeats`` runs of one step (and ``min_seconds`` in all),
    as the serving path runs it: ``await executor.execute`` inside a running loop, including
    the hand-off to the model thread and back (sampling ends with ``tolist()``, which waits for
    a GPU); after one warm-up run (allocator, kernel selection)."""
    await executor.execute(out)
    times: list[float] = []
    while len(times) < repeats or sum(times) < min_seconds:
        start = time.perf_counter()
        await executor.execute(out)
        times.append(time.perf_counter() - start)
    return times


async def _timed(executor: TorchExecutor, out: SchedulerOutput, repeats: int) -> float:
    # At least ``repeats`` runs and MIN_SECONDS in all: a 2 ms CPU step needs dozens of runs
    # before the mean settles on a virtual machine.
    return statistics.fmean(await step_times(executor, out, repeats, MIN_SECONDS))


def _prompt(gen: np.random.Generator, n: int, vocab: int) -> list[int]:
    return gen.integers(0, vocab, n).tolist()


def measure(executor: TorchExecutor, grid: Grid, capacity_tokens: int, seed: int = 0,
            progress: bool = False) -> Samples:
    """Time every grid point that fits; returns (prefill samples, decode samples) in the
    forms fit_prefill and fit_decode take."""
    return asyncio.run(_measure_points(executor, grid_points(grid, capacity_tokens, seed),
                                       grid.repeats, capacity_tokens, seed, progress))


def grid_points(grid: Grid, capacity_tokens: int, seed: int = 0
                ) -> list[tuple[str, int, int, int]]:
    """The points of ``grid`` that fit ``capacity_tokens``, (kind, batch, length, cached), in
    a shuffled order: a machine whose speed drifts spreads the drift over the grid."""
    points = [("p", b, n, 0) for b in grid.prefill_batches for n in grid.lengths
              if b * n <= grid.max_prefill_tokens and b * (n + 1) <= capacity_tokens]
    # Hits: chunks of at least 16 tokens (a shorter one is a decode's cost) over k cached.
    points += [("p", b, n, k) for b in grid.prefill_batches for n in grid.lengths
               for k in grid.cached if n >= 16 and b * n <= grid.max_prefill_tokens
               and b * (n + k + 1) <= capacity_tokens]
    points += [("d", b, n, 0) for b in grid.decode_batches for n in grid.lengths
               if b * (n + 2) <= capacity_tokens]
    random.Random(seed).shuffle(points)
    return points


async def _measure_points(executor: TorchExecutor, points: list[tuple[str, int, int, int]],
                          repeats: int, capacity_tokens: int, seed: int, progress: bool
                          ) -> Samples:
    gen = np.random.default_rng(seed)
    vocab, bs = executor.vocab_size, executor.block_size
    prefill: list[PrefillSample] = []
    decode: list[tuple[int, int, float]] = []
    bar = tqdm(total=len(points), desc="profile", unit="pt", leave=False, disable=not progress)
    for kind, b, n, k in points:
        out = grid_step(kind, b, n, BlockManager(capacity_tokens // bs, bs), gen, vocab, k)
        t = await _timed(executor, out, repeats)
        if kind == "p":
            prefill.append(([n] * b, t, k))
        else:
            decode.append((b, b * (n + 1), t))
        bar.update()
    bar.close()
    return prefill, decode


def grid_step(kind: str, b: int, n: int, kv: BlockManager, gen: np.random.Generator,
              vocab: int, cached: int = 0) -> SchedulerOutput:
    """One grid point's step: ``b`` prompts of ``n`` tokens to prefill (``kind`` "p"; after
    ``cached`` tokens each whose KV is in place, as a prefix-cache hit leaves it), or ``b``
    sequences of context ``n`` to decode one token each ("d"), their KV allocated in ``kv``."""
    out = SchedulerOutput()
    for i in range(b):
        if kind == "p":
            total = cached + n
            s = Sequence(f"p{i}", total, 1, prompt_token_ids=_prompt(gen, total, vocab),
                         num_computed_tokens=cached)
            kv.allocate(s, total + 1)
            out.schedule(s, n)
        else:  # context n: n tokens cached, one to compute
            s = Sequence(f"d{i}", n, 8, prompt_token_ids=_prompt(gen, n, vocab),
                         output_token_ids=[1], num_computed_tokens=n)
            kv.allocate(s, n + 2)
            out.schedule(s, 1)
    return out


class RecordingExecutor:
    """An executor that records the steps it runs, in ``measure``'s sample forms: a serving
    run's own steps, to fit a profile on the batches serving makes (whose mix of contexts no
    grid has). Steps of whole prompts alone are prefill samples, steps of decodes alone decode
    samples; mixed and chunked steps are not recorded."""

    def __init__(self, inner: TorchExecutor) -> None:
        self.inner = inner
        self.prefill: list[PrefillSample] = []
        self.decode: list[tuple[int, int, float]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def execute(self, out: SchedulerOutput) -> dict[Sequence, int] | None:
        sched = out.num_scheduled_tokens
        whole = [n for s, n in sched.items() if s.num_computed_tokens == 0 and n == s.num_tokens]
        # A prompt over its cached prefix (one, alone): a hit sample.
        hit = [(n, s.num_computed_tokens) for s, n in sched.items()
               if s.num_computed_tokens > 0 and s.num_computed_tokens + n == s.num_tokens and
               not s.output_token_ids]
        ctx = [s.num_tokens for s, n in sched.items()
               if n == 1 and s.num_computed_tokens + 1 == s.num_tokens]
        start = time.perf_counter()
        sampled = await self.inner.execute(out)
        took = time.perf_counter() - start
        if whole and len(whole) == len(sched):
            self.prefill.append((whole, took, 0))
        elif len(hit) == 1 == len(sched):
            self.prefill.append(([hit[0][0]], took, hit[0][1]))
        elif ctx and len(ctx) == len(sched):
            self.decode.append((len(ctx), sum(ctx), took))
        return sampled

    def samples(self) -> Samples:
        return list(self.prefill), list(self.decode)


def profile_model(loaded: LoadedModel, grid: Grid, capacity_tokens: int = 65536,
                  block_size: int = 16, seed: int = 0, progress: bool = False,
                  also: Samples = ([], [])) -> Profile:
    """Measure ``loaded`` on ``grid`` with a KV cache of ``capacity_tokens`` and fit, together
    with ``also``: samples measured before (``samples_of`` an earlier profile: a profile taken
    before and after a run brackets it, and a machine whose speed drifts between minutes is
    fitted at its mean over the run), or a serving run's own steps (``RecordingExecutor``)."""
    num_blocks = capacity_tokens // block_size
    executor = TorchExecutor(loaded.model, num_blocks, block_size, threaded=True, seed=seed)
    prefill, decode = measure(executor, grid, num_blocks * block_size, seed, progress)
    executor.shutdown()
    prefill, decode = also[0] + prefill, also[1] + decode
    meta = profile_meta(loaded.name, loaded.model.shape, executor, grid)
    hw = "cuda" if executor.device.type == "cuda" else "cpu"
    return fit_profile(f"{loaded.name}@{hw}", prefill, decode, num_blocks * block_size,
                       block_size, meta)


def profile_meta(name: str, shape: ModelShape, executor: TorchExecutor, grid: Grid) -> dict:
    """A measured profile's ``meta``: the model in the roofline's ModelSpec form (P/D and the
    scaler read KV and weight sizes from it), the device, the dtype and the grid."""
    device = executor.device
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({torch.get_num_threads()} threads)")
    return {
        "model": {"name": name, "layers": shape.num_hidden_layers,
                  "hidden": shape.hidden_size, "heads": shape.num_attention_heads,
                  "kv_heads": shape.num_key_value_heads, "intermediate": shape.intermediate_size,
                  "vocab": shape.vocab_size, "tp": 1},
        "device": device_name,
        "dtype": str(executor.dtype).removeprefix("torch."),
        "grid": {"prefill_batches": list(grid.prefill_batches),
                 "decode_batches": list(grid.decode_batches), "lengths": list(grid.lengths),
                 "max_prefill_tokens": grid.max_prefill_tokens, "repeats": grid.repeats,
                 "cached": list(grid.cached)},
    }
