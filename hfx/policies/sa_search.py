"""Simulated-annealing search over request order and batch sizes (SA §4.3).

A *solution* is an order of the pending requests (a permutation) and a list of batch sizes that
sum to their number; batch k holds the next ``sizes[k]`` requests of the order. Batches prefill
one after another, so batch k waits for the prefills of batches 0..k-1 (the instance decodes
them meanwhile, under continuous batching).

Objective (SA Eq. 2 and Eq. 13): SLO attainment divided by mean predicted E2E latency.

Moves (SA §4.3): *squeeze* a request into the previous batch if it is not in the first
batch and that batch is below the maximum size; *delay* a request into the next batch if that
batch is below the maximum (a new batch after the last); *swap* two requests.

Hyperparameters (SA §5.1, symbols lost in the text; our reading): initial temperature
T0 = 500, stop when the temperature falls below T_min = 20, K = 100 iterations per temperature,
cooling factor α = 0.95. Fig. 8 of the seed raises T0 from 100 to 200, so 100 cannot be the stop
threshold. The seed does not give the scale of the acceptance test; ours is relative: a worse
solution is accepted with probability exp(-1000·(f_old - f_new) / f_old / T), so at T = 20 a 1%
worse solution passes with p ≈ 0.6 and a 10% worse one with p ≈ 0.007.

Speed: one search is 63 temperatures × 100 moves = 6,300 objective evaluations; seed
004 reports ~0.48 ms for it. The loop below works in place on arrays and is compiled by numba
when it is installed (a core dependency); without numba the same source runs as Python, ~100×
slower and bit for bit the same plan. Its random moves come from its own xorshift32 generator
(Marsaglia 2003) for that reason: no library generator is shared by both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hfx.stepmodel.latency import StepTimeModel

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; this keeps odd platforms working
    def _njit(*args: Any, **kwargs: Any) -> Any:
        return args[0] if args and callable(args[0]) else (lambda f: f)

    njit = _njit  # bound by assignment: a second ``def njit`` is a redefinition to mypy

T0, T_MIN, ITERATIONS, ALPHA = 500.0, 20.0, 100, 0.95
_MASK32 = 0xFFFFFFFF
_TWO32 = 4294967296.0


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


# ---- the compiled core: arrays in, arrays out ------------------------------------------------
@njit(cache=True, error_model="numpy", inline="always")
def _next(state: int) -> int:
    """xorshift32: the next state (never 0 from a non-zero one)."""
    state ^= (state << 13) & _MASK32
    state ^= state >> 17
    state ^= (state << 5) & _MASK32
    return state


@njit(cache=True, error_model="numpy", inline="always")
def _evaluate_from(jobs: np.ndarray, order: np.ndarray, sizes: np.ndarray, nb: int, k0: int,
                   coef: np.ndarray, src_f: np.ndarray, src_i: np.ndarray, dst_f: np.ndarray,
                   dst_i: np.ndarray) -> tuple[float, int]:
    """The objective, reusing the state before batch ``k0`` from ``src`` and writing the state
    before each later batch to ``dst`` (a move changes batches from its first one on only).

    jobs rows: prompt, prompt², prompt + output/2, output, waited, TTFT − waited (the slack),
    TPOT. coef: Eq. 1 (a, b, c), Eq. 2 (a', b', c'). State rows: (wait, total, ctx) and (met,
    batch, position).
    """
    wait, total, ctx = src_f[k0, 0], src_f[k0, 1], src_f[k0, 2]
    met, batch, pos = src_i[k0, 0], src_i[k0, 1], src_i[k0, 2]
    for k in range(k0, nb):
        size = sizes[k]
        s_len = 0.0
        s_sq = 0.0
        s_out = 0.0
        s_waited = 0.0
        for q in range(pos, pos + size):
            j = order[q]
            s_len += jobs[j, 0]
            s_sq += jobs[j, 1]
            ctx += jobs[j, 2]
            s_out += jobs[j, 3]
            s_waited += jobs[j, 4]
        prefill = coef[0] + coef[1] * s_len + coef[2] * s_sq
        batch += size
        step = 0.0 if batch == 0 else coef[3] + coef[4] * ctx + coef[5] * batch
        start = wait + prefill  # every member's first token, after what it already waited
        # Σ E2E = Σ (waited + start) + step · Σ output
        total += s_waited + size * start + step * s_out
        for q in range(pos, pos + size):
            j = order[q]
            if start <= jobs[j, 5] and step <= jobs[j, 6]:
                met += 1
        wait = start
        pos += size
        dst_f[k + 1, 0], dst_f[k + 1, 1], dst_f[k + 1, 2] = wait, total, ctx
        dst_i[k + 1, 0], dst_i[k + 1, 1], dst_i[k + 1, 2] = met, batch, pos
    n = pos
    return ((met / n) / (total / n) if total > 0 else 0.0), met


@njit(cache=True, error_model="numpy")
def _state(n: int, base_ctx: float, base_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-batch state arrays, row 0 the state before the first batch."""
    f = np.zeros((n + 2, 3))
    i = np.zeros((n + 2, 3), dtype=np.int64)
    f[0, 2] = base_ctx
    i[0, 1] = base_batch
    return f, i


@njit(cache=True, error_model="numpy")
def _evaluate(jobs: np.ndarray, order: np.ndarray, sizes: np.ndarray, nb: int,
              coef: np.ndarray, base_ctx: float, base_batch: int) -> tuple[float, int]:
    f, i = _state(len(order), base_ctx, base_batch)
    return _evaluate_from(jobs, order, sizes, nb, 0, coef, f, i, f, i)


@njit(cache=True, error_model="numpy", inline="always")
def _batch_of(sizes: np.ndarray, nb: int, position: int) -> tuple[int, int]:
    """(batch index, start position of that batch) for a position in the order."""
    start = 0
    for k in range(nb):
        if position < start + sizes[k]:
            return k, start
        start += sizes[k]
    return nb, start  # unreachable for a position inside the order


@njit(cache=True, error_model="numpy", inline="always")
def _drop_batch(sizes: np.ndarray, nb: int, k: int) -> int:
    for i in range(k, nb - 1):
        sizes[i] = sizes[i + 1]
    return nb - 1


@njit(cache=True, error_model="numpy", inline="always")
def _can_squeeze(sizes: np.ndarray, k: int, max_batch: int) -> bool:
    """A request of batch ``k`` may join the previous batch."""
    return k > 0 and sizes[k - 1] < max_batch


@njit(cache=True, error_model="numpy", inline="always")
def _can_delay(sizes: np.ndarray, nb: int, k: int, max_batch: int) -> bool:
    """A request of batch ``k`` may move to the next batch (or a new last one): not when it is
    alone in the last batch (nowhere later to go), nor when the next batch is full."""
    if sizes[k] == 1 and k == nb - 1:
        return False
    return not (k + 1 < nb and sizes[k + 1] >= max_batch)


@njit(cache=True, error_model="numpy", inline="always")
def _squeeze(order: np.ndarray, sizes: np.ndarray, nb: int, position: int,
             max_batch: int) -> tuple[bool, int]:
    """Move the request at ``position`` to the end of the previous batch, in place."""
    k, start = _batch_of(sizes, nb, position)
    if not _can_squeeze(sizes, k, max_batch):
        return False, nb
    moved = order[position]
    for q in range(position, start, -1):  # the previous batch ends right before ``start``
        order[q] = order[q - 1]
    order[start] = moved
    sizes[k - 1] += 1
    sizes[k] -= 1
    if sizes[k] == 0:
        nb = _drop_batch(sizes, nb, k)
    return True, nb


@njit(cache=True, error_model="numpy", inline="always")
def _delay(order: np.ndarray, sizes: np.ndarray, nb: int, position: int,
           max_batch: int) -> tuple[bool, int]:
    """Move the request at ``position`` to the front of the next batch (a new one after the
    last), in place."""
    k, start = _batch_of(sizes, nb, position)
    if not _can_delay(sizes, nb, k, max_batch):
        return False, nb
    end = start + sizes[k]  # first position of the next batch
    moved = order[position]
    for q in range(position, end - 1):
        order[q] = order[q + 1]
    order[end - 1] = moved
    sizes[k] -= 1
    if k + 1 < nb:
        sizes[k + 1] += 1
    else:
        sizes[nb] = 1
        nb += 1
    if sizes[k] == 0:
        nb = _drop_batch(sizes, nb, k)
    return True, nb


@njit(cache=True, error_model="numpy")
def _anneal(jobs: np.ndarray, coef: np.ndarray, base_ctx: float, base_batch: int,
            max_batch: int, state: int, t0: float, t_min: float, iterations: int, alpha: float,
            order: np.ndarray, sizes: np.ndarray, nb: int,
            score: float) -> tuple[np.ndarray, np.ndarray, float]:
    """SA Algorithm 1's annealing from (order, sizes); returns the best solution seen.
    A candidate is re-evaluated from the first batch its move touched."""
    n = len(order)
    cur_o, cur_s, cur_nb, cur_score = order.copy(), sizes.copy(), nb, score
    best_o, best_s, best_nb, best_score = order.copy(), sizes.copy(), nb, score
    cand_o, cand_s = order.copy(), sizes.copy()
    cur_f, cur_i = _state(n, base_ctx, base_batch)
    cand_f, cand_i = cur_f.copy(), cur_i.copy()
    _evaluate_from(jobs, cur_o, cur_s, cur_nb, 0, coef, cur_f, cur_i, cur_f, cur_i)
    t = t0
    while t >= t_min:
        for _ in range(iterations):
            state = _next(state)
            move = state / _TWO32
            state = _next(state)
            if move < 2 / 3:
                position = state % n
                k, _start = _batch_of(cur_s, cur_nb, position)
                squeeze = move < 1 / 3
                if not (_can_squeeze(cur_s, k, max_batch) if squeeze
                        else _can_delay(cur_s, cur_nb, k, max_batch)):
                    continue  # the move is impossible: nothing to copy or evaluate
                k0 = k - 1 if squeeze else k  # the first batch the move changes
                cand_o[:] = cur_o
                cand_s[:] = cur_s
                if squeeze:
                    _, cand_nb = _squeeze(cand_o, cand_s, cur_nb, position, max_batch)
                else:
                    _, cand_nb = _delay(cand_o, cand_s, cur_nb, position, max_batch)
            else:
                i = state % n
                state = _next(state)
                j = state % n
                cand_o[:] = cur_o
                cand_s[:] = cur_s
                cand_o[i], cand_o[j] = cand_o[j], cand_o[i]
                cand_nb = cur_nb
                k0 = min(_batch_of(cur_s, cur_nb, i)[0], _batch_of(cur_s, cur_nb, j)[0])
            s, _ = _evaluate_from(jobs, cand_o, cand_s, cand_nb, k0, coef, cur_f, cur_i,
                                  cand_f, cand_i)
            worse = cur_score - s
            accept = worse <= 0
            if not accept and cur_score > 0:
                state = _next(state)
                accept = state / _TWO32 < math.exp(-1000.0 * worse / cur_score / t)
            if accept:
                cur_o, cand_o = cand_o, cur_o
                cur_s, cand_s = cand_s, cur_s
                cur_f[k0 + 1:cand_nb + 1] = cand_f[k0 + 1:cand_nb + 1]
                cur_i[k0 + 1:cand_nb + 1] = cand_i[k0 + 1:cand_nb + 1]
                cur_nb, cur_score = cand_nb, s
                if s > best_score:
                    best_o[:] = cur_o
                    best_s[:] = cur_s
                    best_nb, best_score = cur_nb, s
        t *= alpha
    return best_o, best_s[:best_nb], best_score


# ---- the Python face: lists, Jobs and a StepTimeModel ----------------------------------------
def _jobs_array(jobs: list[Job]) -> np.ndarray:
    """Rows as the kernel reads them (see ``_evaluate_from``)."""
    return np.array([(j.prompt_len, j.prompt_len * j.prompt_len, j.prompt_len + j.output_len / 2,
                      j.output_len, j.waited, j.ttft - j.waited, j.tpot) for j in jobs],
                    dtype=np.float64).reshape(len(jobs), 7)


def _coef(model: StepTimeModel) -> np.ndarray:
    return np.array([model.prefill_a, model.prefill_b, model.prefill_c, model.decode_a,
                     model.decode_b, model.decode_c], dtype=np.float64)


def _arrays(order: list[int], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    sized = np.zeros(len(order) + 1, dtype=np.int64)  # room for a new last batch
    sized[:len(sizes)] = sizes
    return np.array(order, dtype=np.int64), sized


def evaluate(jobs: list[Job], order: list[int], sizes: list[int], model: StepTimeModel,
             base_ctx: float = 0.0, base_batch: int = 0) -> tuple[float, int]:
    """(attainment / mean E2E, number of SLOs met) over ``jobs`` in this order and batching.

    Batch k's prefill starts after earlier batches' prefills; its requests then decode at the
    step time of the running batch (``base_batch`` requests with context ``base_ctx`` already
    running, plus every request admitted so far).
    """
    o, s = _arrays(order, sizes)
    score, met = _evaluate(_jobs_array(jobs), o, s, len(sizes), _coef(model), float(base_ctx),
                           int(base_batch))
    return float(score), int(met)


def objective(jobs: list[Job], order: list[int], sizes: list[int], model: StepTimeModel,
              base_ctx: float = 0.0, base_batch: int = 0) -> float:
    """SA's objective: SLO attainment / mean predicted E2E latency."""
    return evaluate(jobs, order, sizes, model, base_ctx, base_batch)[0]


def _move(kernel: Any, order: list[int], sizes: list[int], position: int,
          max_batch: int) -> tuple[list[int], list[int]] | None:
    o, s = _arrays(order, sizes)
    ok, nb = kernel(o, s, len(sizes), position, max_batch)
    return (o.tolist(), s[:nb].tolist()) if ok else None


def squeeze(order: list[int], sizes: list[int], position: int,
            max_batch: int) -> tuple[list[int], list[int]] | None:
    """Move the request at ``position`` to the end of the previous batch."""
    return _move(_squeeze, order, sizes, position, max_batch)


def delay(order: list[int], sizes: list[int], position: int,
          max_batch: int) -> tuple[list[int], list[int]] | None:
    """Move the request at ``position`` to the front of the next batch (a new one after the
    last)."""
    return _move(_delay, order, sizes, position, max_batch)


def swap(order: list[int], sizes: list[int], i: int, j: int) -> tuple[list[int], list[int]]:
    order = order[:]
    order[i], order[j] = order[j], order[i]
    return order, sizes[:]


def full_batches(n: int, max_batch: int) -> list[int]:
    return [max_batch] * (n // max_batch) + ([n % max_batch] if n % max_batch else [])


def anneal(jobs: list[Job], model: StepTimeModel, max_batch: int, seed: int,
           base_ctx: float = 0.0, base_batch: int = 0, t0: float = T0, t_min: float = T_MIN,
           iterations: int = ITERATIONS, alpha: float = ALPHA) -> Plan:
    """SA Algorithm 1: two starting solutions, then annealing from the better one.
    ``seed`` (any int) fixes the moves."""
    n = len(jobs)
    arr, coef = _jobs_array(jobs), _coef(model)
    base_ctx, base_batch = float(base_ctx), int(base_batch)
    sizes0 = full_batches(n, max_batch)
    arrival = list(range(n))
    # Each request's E2E latency alone (SA Eq. 17), to order the second start.
    alone = [model.prefill_one(j.prompt_len)
             + j.output_len * model.decode_time(j.prompt_len + j.output_len / 2, 1) for j in jobs]
    by_latency = sorted(range(n), key=lambda i: (alone[i], i))
    o_arrival, s0 = _arrays(arrival, sizes0)
    o_latency, _ = _arrays(by_latency, sizes0)
    s_arrival, _ = _evaluate(arr, o_arrival, s0, len(sizes0), coef, base_ctx, base_batch)
    s_latency, met = _evaluate(arr, o_latency, s0, len(sizes0), coef, base_ctx, base_batch)
    if met == n:  # ordering by latency meets every SLO: the search is over (SA §4.3)
        return Plan(by_latency, sizes0, float(s_latency))
    start = (o_arrival, s_arrival) if s_arrival >= s_latency else (o_latency, s_latency)
    if n < 2:
        return Plan(start[0].tolist(), sizes0, float(start[1]))
    state = (seed & _MASK32) or 0x9E3779B9  # xorshift needs a non-zero state
    order, sizes, score = _anneal(arr, coef, base_ctx, base_batch, int(max_batch), state,
                                  float(t0), float(t_min), int(iterations), float(alpha),
                                  start[0], s0, len(sizes0), float(start[1]))
    return Plan(order.tolist(), sizes.tolist(), float(score))
