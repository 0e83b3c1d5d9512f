"""The work bound: the most requests per second any dispatcher and engine planner can serve at a
target attainment, under the step-time model every simulated engine runs on.

A capacity says what one policy carries; the bound says how much room there was. It is what is
left when every timing constraint is dropped and only work is counted (ours, from HyperFlexis
§3's Eq. 1 and Eq. 2, the step time the simulator charges):

- A step costs its fixed term plus terms linear in its shape (``StepTimeModel.step_time``), so
  a run's time is its steps' fixed terms plus the sum of every request's own work: its
  prefill (Eq. 1's b and c terms; c over the least attention a prompt can be chunked into, one
  token at a time: c·(k + (c + 1)/2) for c new tokens over k cached, and e·c·k) and its decode
  tokens (Eq. 2's b and c terms over its growing context).
- Decoding needs steps: a step decodes at most ``max_num_seqs`` sequences, and their context
  fits in the KV capacity, so there are at least max(D / S, C / K) decode steps for D decode
  tokens of total context C; each costs at least Eq. 2's fixed term a'. Charged per request as
  a'·(α·d / S + (1 − α)·ctx / K), a lower bound for every α in [0, 1]; the bound takes the
  tightest α of a grid.
- Attainment ``target`` lets the costliest (1 − target) of the requests go unserved, at no cost.
- A prefix is cached wherever it was computed before: any earlier request's blocks (prompt and
  output) count as cached for a later one, on every instance, never evicted.

Hence, for N instances, λ ≤ N / (Σ cost of the cheapest ``target`` share / number of requests):
no queueing, no TTFT, no TPOT, perfect balance and perfect reuse. It is a steady-state bound:
a finite run scored over a window lets the window's last arrivals be served in the drain
after it (within their TTFT, up to 20 s for four-task's wikisql), so a measured capacity can
pass it by a little (HFX on four-task at 1,024 sequences: 213.8 against 213.7; at 0.903
attainment the bound is 210.1 and HFX attained that at 213 req/s with the default 60 s drain,
0.857 with none). A policy's capacity over the
bound is how much of the fleet's work it turned into attained requests; 1.2× the best peer
above the bound is a goal no dispatcher can meet in that cell. Timing constraints are what the
bound leaves out, so it is loose where TTFTs are tight against prefill (wikisql's 0.7 s) or
TPOTs against the decode step (the tiered workloads' 20 ms tier).

Leaving the costliest requests out assumes their costs known: their output lengths, which
no contender reads (each predicts them from its tasks' history, hfx/policies/output_length.py;
least-loaded alone counts ``max_tokens``, a real request's cap, which the simulator sets to
the output length, to balance its load). The **blind bound** (``output_known=False``) is the
same count for a dispatcher that knows what a request shows when it arrives, its task and
prompt length, and never stops a request it started: it serves the ``target`` share of least
*expected* cost, each request's output moments taken over its task's requests of like prompt
length (deciles of its task by prompt length, ``OUTPUT_BINS``), and pays their expected
work. A dispatcher that starts a request cannot stop paying for it, and one that leaves it
queued learns nothing of its length, so a request's expected cost is all it can rank by.
Where a task's output lengths vary apart from its prompts (two-task's sharegpt: 208 ± 235
tokens, drawn apart from the prompt) it is lower than the work bound; where the prompt
decides the cost (wikisql, four-task) it is the same. It holds where a workload draws each
output length apart from the prompt (the task sets, tiered and bursty sets:
``blind_applies``); a trace's or a session's lengths may follow what a dispatcher sees, and
have none. It bounds an expectation: one finite run may pass it by the luck of its draws.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from hfx.config import SimConfig
from hfx.engine.prefix_cache import keys_of, prompt_keys
from hfx.request import Request
from hfx.stepmodel.step_time import StepTimeModel

ALPHAS = tuple(i / 10 for i in range(11))  # the decode-step mix D/S against C/K, searched
OUTPUT_BINS = 10  # the blind bound's bins of a task's requests by prompt length...
OUTPUT_BIN_SIZE = 100  # ...fewer where a bin would hold fewer requests than this


@dataclass(frozen=True, slots=True)
class WorkBound:
    qps: float  # the bound, requests/s for the fleet
    target: float  # attainment it is for
    requests: int  # requests in the population it was computed over
    cached_share: float  # prompt tokens that were cached, over prompt tokens
    alpha: float  # the decode-step mix that gave the tightest bound
    output_known: bool  # False: the blind bound (expected output lengths, module docstring)
    # Seconds of work per request (all requests, served or not) by term: fixed (decode steps),
    # prefill, decode.
    per_request: dict[str, float]

    def to_json(self) -> dict:
        return {"qps": self.qps, "target": self.target, "requests": self.requests,
                "cached_share": self.cached_share, "alpha": self.alpha,
                "output_known": self.output_known, "per_request_seconds": self.per_request}


def cached_prefixes(requests: Iterable[Request], block_size: int) -> list[int]:
    """Each request's prompt tokens cached if every block computed before it, by any earlier
    request of ``requests`` (in arrival order), were still held: its longest prefix of known
    units seen before."""
    seen: set[int] = set()
    out = []
    for r in requests:
        keys, unit = prompt_keys(r.block_hashes, r.hash_block, r.prompt_token_ids,
                                 r.prompt_len, block_size)
        hit = 0
        for k in keys:
            if k not in seen:
                break
            hit += 1
        out.append(min(hit * unit, r.prompt_len))
        if r.block_hashes is not None:
            seen.update(keys_of(r.block_hashes, r.hash_block, block_size)[0])
        else:
            seen.update(keys)
    return out


def expected_outputs(tasks: Sequence[str], prompt_lens: np.ndarray, decodes: np.ndarray,
                     bins: int = OUTPUT_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Each request's expected decode count and its square given its task and prompt length:
    the means over its task's requests in the same of ``bins`` bins by prompt length (equal
    counts of at least ``OUTPUT_BIN_SIZE`` where the task has them; ties split by arrival
    order). A bin of a few requests would know their outputs."""
    mean = np.empty(len(decodes))
    square = np.empty(len(decodes))
    _, which = np.unique(np.array(tasks), return_inverse=True)
    for members in np.split(np.argsort(which, kind="stable"),
                            np.cumsum(np.bincount(which))[:-1]):
        by_prompt = members[np.argsort(prompt_lens[members], kind="stable")]
        parts = max(1, min(bins, len(by_prompt) // OUTPUT_BIN_SIZE))
        for part in np.array_split(by_prompt, parts):
            mean[part] = decodes[part].mean()
            square[part] = (decodes[part] ** 2).mean()
    return mean, square


def work_bound(requests: Sequence[Request], model: StepTimeModel, instances: int,
               max_num_seqs: int, kv_capacity_tokens: int, target: float = 0.9,
               block_size: int = 16, prefix_caching: bool = True,
               output_known: bool = True) -> WorkBound:
    """The most requests/s ``instances`` instances serve at ``target`` attainment, for the mix
    of ``requests`` (its rate is what is bounded; their arrival times only order their
    prefixes). ``output_known=False``: the blind bound (the module's docstring)."""
    if not requests:
        raise ValueError("the work bound needs at least one request")
    if not 0 < target <= 1:
        raise ValueError(f"target must be in (0, 1], got {target}")
    ordered = sorted(requests, key=lambda r: r.arrival)
    n_in = np.array([r.prompt_len for r in ordered], dtype=float)
    k = (np.array(cached_prefixes(ordered, block_size), dtype=float) if prefix_caching
         else np.zeros(len(ordered)))
    c = n_in - k  # new prompt tokens
    d = np.maximum(np.array([r.max_tokens for r in ordered], dtype=float) - 1, 0)  # decodes
    prefill = (model.prefill_b * c + model.prefill_c * c * (k + (c + 1) / 2)
               + model.prefill_e * c * k)
    if output_known:
        d2 = d * d
    else:  # what is paid for the requests served is their expected work
        d, d2 = expected_outputs([r.task for r in ordered], n_in, d)
    ctx = n_in * d + (d2 + d) / 2  # Σ context over the decode tokens
    decode = model.decode_b * ctx + model.decode_c * d
    served = int(np.ceil(target * len(ordered)))
    best: tuple[float, float, np.ndarray] | None = None
    for alpha in ALPHAS:
        fixed = model.decode_a * (alpha * d / max_num_seqs
                                  + (1 - alpha) * ctx / kv_capacity_tokens)
        cost = fixed + prefill + decode
        work = float(np.sort(cost)[:served].sum()) / len(ordered)
        qps = instances / work if work > 0 else float("inf")
        if best is None or qps < best[0]:
            best = (qps, alpha, fixed)
    assert best is not None
    qps, alpha, fixed = best
    return WorkBound(qps=qps, target=target, requests=len(ordered),
                     cached_share=float(k.sum() / n_in.sum()) if n_in.sum() else 0.0,
                     alpha=alpha, output_known=output_known,
                     per_request={"fixed": float(fixed.mean()), "prefill": float(prefill.mean()),
                                  "decode": float(decode.mean())})


def config_bound(config: SimConfig, target: float = 0.9, output_known: bool = True) -> WorkBound:
    """The work bound (or with ``output_known=False`` the blind bound) of a simulation's fleet
    and workload (colocated instances; the workload's requests as ``hfx sim`` would draw them
    for this config)."""
    if not output_known and not blind_applies(config.workload):
        raise ValueError(f"no blind bound for {config.workload}: its output lengths are not "
                         "drawn apart from what a dispatcher sees of a request")
    return _config_bounds(config, target, (output_known,))[0]


def config_bounds(config: SimConfig, target: float = 0.9) -> tuple[WorkBound, WorkBound | None]:
    """``config_bound``'s work bound and blind bound, from one draw of the requests; no blind
    bound for a workload whose output lengths may follow its prompts (a trace, sessions): a
    dispatcher could tell more from a prompt than a decile of its length."""
    if not blind_applies(config.workload):
        return _config_bounds(config, target, (True,))[0], None
    work, blind = _config_bounds(config, target, (True, False))
    return work, blind


def blind_applies(workload: str) -> bool:
    """Whether the blind bound holds for ``workload``: its output lengths drawn apart from its
    prompts, given the task (hfx/workloads/kinds.py)."""
    from hfx.workloads.kinds import kind_of

    return kind_of(workload).outputs_apart()


def _config_bounds(config: SimConfig, target: float,
                   known: tuple[bool, ...]) -> list[WorkBound]:
    from hfx.sim.driver import load_requests, resolve_profile

    if config.mode != "colocated":
        raise ValueError("the work bound is for colocated instances")
    profile = resolve_profile(config)
    requests = list(load_requests(config))
    kv = config.kv_capacity_tokens or profile.kv_capacity_tokens
    return [work_bound(requests, profile.model, config.instances, config.max_num_seqs, kv,
                       target, config.block_size, config.prefix_caching, k) for k in known]
