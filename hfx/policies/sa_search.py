"""Simulated-annealing search over request order and batch sizes (seed 004 §4.3).

A *solution* is an order of the pending requests (a permutation) and a list of batch sizes that
sum to their number; batch k holds the next ``sizes[k]`` requests of the order. Batches prefill
one after another, so batch k waits for the prefills of batches 0..k-1 (the instance decodes
them meanwhile, under continuous batching).

Objective (seed 004 Eq. 2 and Eq. 13): SLO attainment divided by mean predicted E2E latency.

Moves (seed 004 §4.3): *squeeze* a request into the previous batch if it is not in the first
batch and that batch is below the maximum size; *delay* a request into the next batch if that
batch is below the maximum (a new batch after the last); *swap* two requests.

Hyperparameters (seed 004 §5.1, symbols lost in the text; our reading): initial temperature
T0 = 500, stop when the temperature falls below T_min = 20, K = 100 iterations per temperature,
cooling factor α = 0.95. Fig. 8 of the seed raises T0 from 100 to 200, so 100 cannot be the stop
threshold. The seed does not give the scale of the acceptance test; ours is relative: a worse
solution is accepted with probability exp(-1000·(f_old - f_new) / f_old / T), so at T = 20 a 1%
worse solution passes with p ≈ 0.6 and a 10% worse one with p ≈ 0.007.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from hfx.latency import StepTimeModel

T0, T_MIN, ITERATIONS, ALPHA = 500.0, 20.0, 100, 0.95


@dataclass(frozen=True, slots=True)
class Job:
    """A pending request as the search sees it (times in seconds)."""

    prompt_len: int
    output_len: float  # predicted
    waited: float  # already waited before now
    ttft: float
    tpot: float


@dataclass(slots=True)
class Plan:
    order: list[int]
    sizes: list[int]
    score: float


def evaluate(jobs: list[Job], order: list[int], sizes: list[int], model: StepTimeModel,
             base_ctx: float = 0.0, base_batch: int = 0) -> tuple[float, int]:
    """(attainment / mean E2E, number of SLOs met) over ``jobs`` in this order and batching.

    Batch k's prefill starts after earlier batches' prefills; its requests then decode at the
    step time of the running batch (``base_batch`` requests with context ``base_ctx`` already
    running, plus every request admitted so far).
    """
    wait = 0.0
    met = 0
    total = 0.0
    ctx, batch = base_ctx, base_batch
    pos = 0
    for size in sizes:
        s_len = s_sq = 0.0
        for j in order[pos:pos + size]:
            p = jobs[j].prompt_len
            s_len += p
            s_sq += p * p
        prefill = model.prefill_time(s_len, s_sq)
        members = order[pos:pos + size]
        for j in members:
            ctx += jobs[j].prompt_len + jobs[j].output_len / 2
        batch += size
        step = model.decode_time(ctx, batch)
        for j in members:
            job = jobs[j]
            ttft = job.waited + wait + prefill
            total += ttft + job.output_len * step
            if ttft <= job.ttft and step <= job.tpot:
                met += 1
        wait += prefill
        pos += size
    n = len(order)
    return ((met / n) / (total / n) if total > 0 else 0.0), met


def objective(jobs: list[Job], order: list[int], sizes: list[int], model: StepTimeModel,
              base_ctx: float = 0.0, base_batch: int = 0) -> float:
    """Seed 004's objective: SLO attainment / mean predicted E2E latency."""
    return evaluate(jobs, order, sizes, model, base_ctx, base_batch)[0]


def full_batches(n: int, max_batch: int) -> list[int]:
    return [max_batch] * (n // max_batch) + ([n % max_batch] if n % max_batch else [])


def _batch_of(sizes: list[int], position: int) -> tuple[int, int]:
    """(batch index, start position of that batch) for a position in the order."""
    start = 0
    for k, s in enumerate(sizes):
        if position < start + s:
            return k, start
        start += s
    raise IndexError(position)


def squeeze(order: list[int], sizes: list[int], position: int,
            max_batch: int) -> tuple[list[int], list[int]] | None:
    """Move the request at ``position`` to the end of the previous batch."""
    k, start = _batch_of(sizes, position)
    if k == 0 or sizes[k - 1] >= max_batch:
        return None
    order, sizes = order[:], sizes[:]
    order.insert(start, order.pop(position))  # the previous batch ends right before ``start``
    sizes[k - 1] += 1
    sizes[k] -= 1
    if sizes[k] == 0:
        del sizes[k]
    return order, sizes


def delay(order: list[int], sizes: list[int], position: int,
          max_batch: int) -> tuple[list[int], list[int]] | None:
    """Move the request at ``position`` to the front of the next batch (a new one after the
    last)."""
    k, start = _batch_of(sizes, position)
    if sizes[k] == 1 and k == len(sizes) - 1:
        return None  # alone in the last batch: nowhere later to go
    if k + 1 < len(sizes) and sizes[k + 1] >= max_batch:
        return None
    order, sizes = order[:], sizes[:]
    end = start + sizes[k]  # first position of the next batch
    order.insert(end - 1, order.pop(position))
    sizes[k] -= 1
    if k + 1 < len(sizes):
        sizes[k + 1] += 1
    else:
        sizes.append(1)
    if sizes[k] == 0:
        del sizes[k]
    return order, sizes


def swap(order: list[int], sizes: list[int], i: int, j: int) -> tuple[list[int], list[int]]:
    order = order[:]
    order[i], order[j] = order[j], order[i]
    return order, sizes[:]


def anneal(jobs: list[Job], model: StepTimeModel, max_batch: int, rng: random.Random,
           base_ctx: float = 0.0, base_batch: int = 0, t0: float = T0, t_min: float = T_MIN,
           iterations: int = ITERATIONS, alpha: float = ALPHA) -> Plan:
    """Seed 004 Algorithm 1: two starting solutions, then annealing from the better one."""
    n = len(jobs)

    def score(order: list[int], sizes: list[int]) -> float:
        return objective(jobs, order, sizes, model, base_ctx, base_batch)

    sizes0 = full_batches(n, max_batch)
    arrival = list(range(n))
    # Each request's E2E latency alone (seed 004 Eq. 17), to order the second start.
    alone = [model.prefill_one(j.prompt_len)
             + j.output_len * model.decode_time(j.prompt_len + j.output_len / 2, 1) for j in jobs]
    by_latency = sorted(range(n), key=lambda i: (alone[i], i))
    s_arrival = score(arrival, sizes0)
    s_latency, met = evaluate(jobs, by_latency, sizes0, model, base_ctx, base_batch)
    if met == n:  # ordering by latency meets every SLO: the search is over (seed 004 §4.3)
        return Plan(by_latency, sizes0, s_latency)
    cur = Plan(arrival, sizes0, s_arrival) if s_arrival >= s_latency else Plan(
        by_latency, sizes0, s_latency)
    best = Plan(cur.order, cur.sizes, cur.score)
    if n < 2:
        return best
    t = t0
    while t >= t_min:
        for _ in range(iterations):
            move = rng.random()
            if move < 1 / 3:
                cand = squeeze(cur.order, cur.sizes, rng.randrange(n), max_batch)
            elif move < 2 / 3:
                cand = delay(cur.order, cur.sizes, rng.randrange(n), max_batch)
            else:
                cand = swap(cur.order, cur.sizes, rng.randrange(n), rng.randrange(n))
            if cand is None:
                continue
            s = score(*cand)
            worse = cur.score - s
            if worse <= 0 or (cur.score > 0 and rng.random() < math.exp(
                    -1000.0 * worse / cur.score / t)):
                cur = Plan(cand[0], cand[1], s)
                if s > best.score:
                    best = Plan(cand[0], cand[1], s)
        t *= alpha
    return best

