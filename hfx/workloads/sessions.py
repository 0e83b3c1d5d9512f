"""Workloads whose prompts repeat (issue 46): multi-turn chat, shared system prompts, agent loops.

Three kinds (registered in hfx/workloads/kinds.py), each request's ``task`` the kind's name:

- ``chat-sessions``: conversations. Each turn's prompt resends the whole history, every earlier
  user message and answer, then a new user message; the next turn arrives a think time later.
- ``shared-prompts``: applications, each with a long system prompt that all its requests share,
  then a user part of each request's own; a few applications get most requests (Zipf).
- ``agent-loops``: agents' tool loops. Each step's prompt is the previous step's prompt, the
  model's tool call (the previous step's output) and the tool's result; the next step arrives
  when the call has been generated and the tool has run.

**Content.** A request names its tokens by ``block_hashes``: one per ``HASH_BLOCK`` tokens, over
its prompt and on over its output, so the next turn or step finds the answer cached. Each unit
(a conversation, an agent's task, a shared-prompt request) is one token stream, a turn or step
the stream's first tokens; a block's hash comes from (seed, kind, unit, block index), and a
block wholly inside an application's system prompt from (seed, kind, application, block index),
so equal content at an equal position has an equal hash. A request's last block, where its
tokens end inside it, is partial: its hash also names how many tokens it holds (the engine
never caches it, and a later turn's full block there holds other tokens).

**Arrivals.** Units arrive as a Poisson process at ``qps`` / (requests per unit), so requests
arrive at ``qps`` on average; requests per unit (a kind's turns or steps, less those cut at
``MAX_CONTEXT``) are estimated from ``CALIBRATION_UNITS`` units drawn apart. The stream is
stationary from time 0: conversations and loops began up to ``WARM`` seconds earlier, and only
their requests from 0 on are sent (a turn's earlier turns may lie before 0, as in a trace cut
from a longer log). With a duration, the requests arriving in [0, duration); without, the first
``requests_per_task`` of them. A unit's content and its gaps do not depend on ``qps``: the rate
moves the units' start times only. Every parameter is cited beside its value; "our choice" where
none was found.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache

import numpy as np

from hfx.request import SLO, Request
from hfx.workloads.task_draws import lognormal_lengths
from hfx.workloads.tasks import TASKS, TaskSpec

CHAT, SHARED, AGENT = "chat-sessions", "shared-prompts", "agent-loops"
KINDS = (CHAT, SHARED, AGENT)

# Tokens per content hash: vLLM's default KV block size (vllm/config/cache.py,
# ``CacheConfig.DEFAULT_BLOCK_SIZE`` 16), also the engine's (hfx/engine/config.py): a hash names
# one KV block.
HASH_BLOCK = 16
# Prompt + output of one request: the engine's default max_model_len (hfx/engine/config.py,
# Qwen2.5's context). A conversation or loop stops before a request that would exceed it.
MAX_CONTEXT = 32768
# Every kind's SLO: Table 1's conversational task, sharegpt (TTFT 2 s, TPOT 0.5 s); for
# shared-prompts and agent-loops our choice.
SLO_OF_KINDS: SLO = TASKS["sharegpt"].slo

# ---- chat-sessions -----------------------------------------------------------------------------
# Turns per conversation: ShareGPT's 330,239 turns in 94,145 conversations, mean 3.51 (WildChat,
# Zhao et al., ICLR'24, Table 1). Geometric (the shape our choice): 1 − 1/3.51 = 71.5% of
# conversations have several turns, as CachedAttention (Gao et al., USENIX ATC'24) counts 73% of
# ShareGPT's conversations multi-turn (its motivation; the section number not checked here).
TURNS_MEAN = 3.51
# A user message and an answer, tokens (mean, std): ShareGPT's user turns 94.46 ± 626.39 and
# chatbot turns 348.45 ± 269.93 (WildChat Table 1, Llama-2 tokenizer); log-normal, as Table 1's
# task lengths are drawn (hfx/workloads/load.py).
USER_TOKENS = (94.46, 626.39)
ANSWER_TOKENS = (348.45, 269.93)
# Arrival to arrival of a conversation's consecutive turns (the answer's generation and the
# user's think time), seconds: log-normal with median 123 s and sigma 1.05, fitted to Mooncake's
# FAST'25 conversation trace (traces/conversation_trace.jsonl; our measurement over its 4,658
# consecutive-turn gaps, turns grouped by their second hash id: p50 123 s, mean 214 s, p90 480 s;
# the fit gives mean 214 s, p90 474 s).
THINK_MEDIAN, THINK_SIGMA = 123.0, 1.05
# How long before 0 conversations and loops may have begun, seconds (our choice: Mooncake's
# traces are one hour of requests; a conversation spans 533 s on average, 1% over an hour).
WARM = 3600.0

# ---- shared-prompts ----------------------------------------------------------------------------
# Applications, and their popularity: the application of rank r draws a share ∝ r^-1 (both our
# choice; Zipf-like popularity, as web objects' (Breslau et al., INFOCOM'99)).
APPS = 16
ZIPF = 1.0
# Mooncake's Tool&Agent workload (Qin et al., FAST'25, Table 2): mean input 8,596 tokens, mean
# output 182, 59% of input cached; its requests carry "pre-designed, often lengthy, system
# prompts that are fully repetitive" (§5.2.1). Our reading: the cached 59% is the system prompt.
TOOLAGENT_INPUT, TOOLAGENT_CACHED, TOOLAGENT_OUTPUT = 8596, 0.59, 182
# An application's system prompt, tokens (mean, std): mean 5,072 = 59% of 8,596 (Table 2); the
# std, half the mean, our choice. Drawn once per application and seed.
SYSTEM_TOKENS = (TOOLAGENT_CACHED * TOOLAGENT_INPUT, 0.5 * TOOLAGENT_CACHED * TOOLAGENT_INPUT)
# A request's own part: mean 3,524 = 8,596 − 5,072 (Table 2); std = mean, our choice.
USER_PART_TOKENS = ((1 - TOOLAGENT_CACHED) * TOOLAGENT_INPUT,
                    (1 - TOOLAGENT_CACHED) * TOOLAGENT_INPUT)
# Output: mean 182 (Table 2, Tool&Agent); std = mean, our choice. Also each agent step's.
OUTPUT_TOKENS = (float(TOOLAGENT_OUTPUT), float(TOOLAGENT_OUTPUT))

# ---- agent-loops -------------------------------------------------------------------------------
# Agents (tool sets), each with a system prompt drawn as an application's above, popularity as
# the applications' (our choice).
AGENTS = 4
# Model calls per task: 1 + min(floor(L), 86), L log-normal with median 1.5 and sigma 2.04, fitted
# to TraceLab's tool-initiated steps per request (Zhu et al., arXiv 2606.30560, 2026,
# tab:session_internal_counts; 39,202 Claude Code and Codex requests): p25 0, p50 1, p90 20,
# p99 86, mean 7.8 (the fit: 0, 1, 20, 86, mean 7.4). The cap at 86 is its p99.
STEPS_MEDIAN, STEPS_SIGMA, STEPS_CAP = 1.5, 2.04, 86
# A tool's result, tokens: log-normal with median 875, TraceLab's median newly appended tokens
# per step (paper_macros: \medianuncachedinputtokens); sigma 1.0 our choice.
RESULT_MEDIAN, RESULT_SIGMA = 875.0, 1.0
# Between a step's arrival and the next: the step's generation, then the tool's run, seconds,
# each log-normal fitted to TraceLab's individual latencies (tab:timing_distribution):
# generation p50 5.7 s, p90 22.2 s (sigma 1.06); tool p50 0.3 s, p90 13.6 s (sigma 2.98), cut
# at 600 s (our choice; TraceLab's p99 is 3.6 min, the fit's 5.2 min).
GENERATION_MEDIAN, GENERATION_SIGMA = 5.7, math.log(22.2 / 5.7) / 1.2816
TOOL_MEDIAN, TOOL_SIGMA, TOOL_CAP = 0.3, math.log(13.6 / 0.3) / 1.2816, 600.0

# ---- drawing -----------------------------------------------------------------------------------
UNITS_PER_DRAW = 256  # units drawn from one generator: a draw's numbers do not depend on how many
CALIBRATION_UNITS = 32768  # units drawn apart to estimate a kind's requests per unit
_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Rows:
    """Requests of some units as columns: the unit (index in the stream), the turn or step in
    it, arrival [s], prompt and output tokens, and the shared prefix: its application (-1:
    none) and its tokens."""

    unit: np.ndarray
    step: np.ndarray
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    app: np.ndarray
    shared: np.ndarray

    def take(self, index: np.ndarray) -> Rows:
        return Rows(*(getattr(self, f)[index] for f in Rows.__slots__))

    @staticmethod
    def join(parts: list[Rows]) -> Rows:
        return Rows(*(np.concatenate([getattr(p, f) for p in parts]) for f in Rows.__slots__))


@dataclass(frozen=True, slots=True)
class Apps:
    """Applications (or agents) of one seed: each one's system prompt length and popularity."""

    system: np.ndarray  # tokens of each one's system prompt
    share: np.ndarray  # probability a unit belongs to each

    @staticmethod
    def draw(rng: np.random.Generator, count: int, system: tuple[float, float],
             zipf: float = ZIPF) -> Apps:
        share = np.arange(1, count + 1, dtype=np.float64) ** -zipf
        return Apps(lognormal_lengths(rng, *system, count), share / share.sum())

    def pick(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(len(self.system), n, p=self.share)


Units = Callable[[np.random.Generator, np.ndarray, np.ndarray, Apps | None], Rows]


def _within(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``values`` restarting at each unit's first row (``counts`` rows each,
    all >= 1)."""
    sums = np.cumsum(values)
    ends = np.cumsum(counts)
    before = np.concatenate(([0], sums[ends[:-1] - 1]))
    return sums - np.repeat(before, counts)


def _median_lognormal(rng: np.random.Generator, median: float, sigma: float,
                      n: int) -> np.ndarray:
    return rng.lognormal(math.log(median), sigma, n)


def _rows(units: np.ndarray, counts: np.ndarray, arrival: np.ndarray, prompt: np.ndarray,
          output: np.ndarray, app: np.ndarray, shared: np.ndarray) -> Rows:
    """Each unit's rows, cut before the first whose prompt + output exceeds MAX_CONTEXT (a
    unit's contexts grow, so what is left of it is a prefix of its turns)."""
    step = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = Rows(np.repeat(units, counts), step, arrival, prompt, output, np.repeat(app, counts),
                np.repeat(shared, counts))
    return rows.take(np.flatnonzero(prompt + output <= MAX_CONTEXT))


def chat_units(rng: np.random.Generator, units: np.ndarray, starts: np.ndarray,
               apps: Apps | None) -> Rows:
    """Conversations beginning at ``starts``; with ``apps``, each opens with its application's
    system prompt (make_session_trace.py's sessions), else with its first user message."""
    n = len(units)
    turns = rng.geometric(1 / TURNS_MEAN, n)
    total = int(turns.sum())
    user = lognormal_lengths(rng, *USER_TOKENS, total)
    answer = lognormal_lengths(rng, *ANSWER_TOKENS, total)
    gap = _median_lognormal(rng, THINK_MEDIAN, THINK_SIGMA, total)
    if apps is not None:
        app = apps.pick(rng, n)
        shared = apps.system[app]
    else:
        app, shared = np.full(n, -1), np.zeros(n, dtype=np.int64)
    gap[np.cumsum(turns) - turns] = 0.0  # a conversation's first turn comes at its start
    end = np.repeat(shared, turns) + _within(user + answer, turns)  # history after each answer
    return _rows(units, turns, np.repeat(starts, turns) + _within(gap, turns), end - answer,
                 answer, app, shared)


def shared_units(rng: np.random.Generator, units: np.ndarray, starts: np.ndarray,
                 apps: Apps | None) -> Rows:
    """Single requests: an application's system prompt, then a part of the request's own."""
    assert apps is not None
    n = len(units)
    app = apps.pick(rng, n)
    user = lognormal_lengths(rng, *USER_PART_TOKENS, n)
    output = lognormal_lengths(rng, *OUTPUT_TOKENS, n)
    shared = apps.system[app]
    return _rows(units, np.ones(n, dtype=np.int64), starts, shared + user, output, app, shared)


def agent_units(rng: np.random.Generator, units: np.ndarray, starts: np.ndarray,
                apps: Apps | None) -> Rows:
    """Tool loops: the agent's system prompt and the task's request, then per step the model's
    tool call and the tool's result."""
    assert apps is not None
    n = len(units)
    app = apps.pick(rng, n)
    steps = 1 + np.minimum(np.floor(_median_lognormal(rng, STEPS_MEDIAN, STEPS_SIGMA, n)),
                           STEPS_CAP).astype(np.int64)
    total = int(steps.sum())
    query = lognormal_lengths(rng, *USER_TOKENS, n)
    output = lognormal_lengths(rng, *OUTPUT_TOKENS, total)
    result = np.maximum(np.rint(_median_lognormal(rng, RESULT_MEDIAN, RESULT_SIGMA, total)),
                        1).astype(np.int64)
    wait = (_median_lognormal(rng, GENERATION_MEDIAN, GENERATION_SIGMA, total)
            + np.minimum(_median_lognormal(rng, TOOL_MEDIAN, TOOL_SIGMA, total), TOOL_CAP))
    shared = apps.system[app]
    appended = output + result  # what a step adds to the next one's prompt
    prompt = np.repeat(shared + query, steps) + _within(appended, steps) - appended
    arrival = np.repeat(starts, steps) + _within(wait, steps) - wait
    return _rows(units, steps, arrival, prompt, output, app, shared)


@dataclass(frozen=True, slots=True)
class Shape:
    """How a kind draws: its units, its applications (count, system prompt tokens), the tag
    that keeps its generators and hashes apart from other kinds', and how long before 0 its
    units may begin."""

    units: Units
    tag: int
    apps: int = 0
    system: tuple[float, float] = SYSTEM_TOKENS
    warm: float = WARM


SHAPES: dict[str, Shape] = {
    CHAT: Shape(chat_units, 1),
    SHARED: Shape(shared_units, 2, APPS, warm=0.0),
    AGENT: Shape(agent_units, 3, AGENTS),
}


def _apps(shape: Shape, seed: int) -> Apps | None:
    if not shape.apps:
        return None
    return Apps.draw(np.random.default_rng([seed, shape.tag, 0]), shape.apps, shape.system)


@cache
def requests_per_unit(shape: Shape, seed: int) -> float:
    """Mean requests of a unit of this shape and seed (its applications shape its cuts at
    MAX_CONTEXT), from CALIBRATION_UNITS units of a generator of their own."""
    rng = np.random.default_rng([seed, shape.tag, 1])
    units = np.arange(CALIBRATION_UNITS)
    rows = shape.units(rng, units, np.zeros(CALIBRATION_UNITS), _apps(shape, seed))
    return max(len(rows.unit), 1) / CALIBRATION_UNITS


def draw_rows(shape: Shape, qps: float, seed: int, *, duration: float | None = None,
              count: int | None = None, units: int | None = None) -> Rows:
    """Rows in arrival order (ties: unit, then step): those arriving in [0, ``duration``), the
    first ``count`` from 0, or every row of the first ``units`` units (whole units, beginning
    at 0: no warm start)."""
    if not (0 < qps < math.inf):
        raise ValueError(f"qps must be positive and finite, got {qps}")
    apps = _apps(shape, seed)
    rate = qps / requests_per_unit(shape, seed)
    start = 0.0 if units is not None else -shape.warm
    parts: list[Rows] = []
    for block in itertools.count():
        rng = np.random.default_rng([seed, shape.tag, 2, block])
        starts = start + np.cumsum(rng.exponential(1 / rate, UNITS_PER_DRAW))
        start = float(starts[-1])
        ids = np.arange(block * UNITS_PER_DRAW, (block + 1) * UNITS_PER_DRAW)
        parts.append(shape.units(rng, ids, starts, apps))
        if units is not None and ids[-1] + 1 >= units:
            break
        if duration is not None and start >= duration:
            break  # every unit beginning before the end is drawn: no later one arrives earlier
        if count is not None and sum(int(np.count_nonzero((p.arrival >= 0) & (p.arrival < start)))
                                     for p in parts) >= count:
            break
    rows = Rows.join(parts)
    if units is not None:
        keep = rows.unit < units
    elif duration is not None:
        keep = (rows.arrival >= 0) & (rows.arrival < duration)
    else:
        keep = rows.arrival >= 0
    rows = rows.take(np.flatnonzero(keep))
    rows = rows.take(np.lexsort((rows.step, rows.unit, rows.arrival)))
    if count is not None:
        rows = rows.take(np.arange(min(count, len(rows.unit))))
    return rows


# ---- content hashes ----------------------------------------------------------------------------
def _mix(x: int) -> int:
    """splitmix64's finalizer on a 64-bit int."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _key(*parts: int) -> int:
    key = 0
    for part in parts:
        key = _mix(key ^ (part & _MASK))
    return key


def _mix_array(x: np.ndarray) -> np.ndarray:
    """``_mix`` over uint64s (numpy's unsigned arithmetic wraps, as the masks do)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def block_hashes(key: int, start: int, stop: int) -> list[int]:
    """The hashes of full blocks ``start`` to ``stop`` of the stream ``key``: non-negative
    63-bit ints, as trace ids are."""
    j = _mix_array(np.arange(start, stop, dtype=np.uint64))
    return (_mix_array(j ^ np.uint64(key)) >> np.uint64(1)).tolist()


_SYSTEM, _STREAM, _PARTIAL = 1, 2, 3


class Hasher:
    """Each row's hashes, one per ``hash_block`` tokens of its prompt and output. A unit's and
    an application's hashes are made once and sliced for each row, so rows share their int
    objects (a 30k-token prompt's 2k hashes are pointers to ints most rows hold already)."""

    def __init__(self, tag: int, seed: int, hash_block: int = HASH_BLOCK) -> None:
        self.tag, self.seed, self.block = tag, seed, hash_block
        self._apps: dict[int, list[int]] = {}
        self._units: dict[int, list[int]] = {}

    def app(self, app: int, blocks: int) -> list[int]:
        have = self._apps.get(app, [])
        if len(have) < blocks:
            have = have + block_hashes(_key(_SYSTEM, self.seed, self.tag, app), len(have),
                                       blocks)
            self._apps[app] = have
        return have

    def unit(self, unit: int, first: int, stop: int) -> list[int]:
        """The unit's own blocks ``first`` (its first past the shared prefix) to ``stop``."""
        have = self._units.get(unit, [])
        if first + len(have) < stop:
            have = have + block_hashes(_key(_STREAM, self.seed, self.tag, unit),
                                       first + len(have), stop)
            self._units[unit] = have
        return have

    def forget(self, unit: int) -> None:
        self._units.pop(unit, None)

    def row(self, unit: int, app: int, shared: int, covered: int) -> tuple[int, ...]:
        """Hashes of the first ``covered`` tokens of the unit's stream, of which the first
        ``shared`` are application ``app``'s system prompt."""
        g = self.block
        full, rest = divmod(covered, g)
        common = min(shared // g, full) if app >= 0 else 0
        own = self.unit(unit, common, full)
        parts = [self.app(app, common)[:common] if common else [], own[:full - common]]
        if rest:
            parts.append([_key(_PARTIAL, self.seed, self.tag, unit, full, rest) >> 1])
        return tuple(itertools.chain.from_iterable(parts))


def to_requests(kind: str, rows: Rows, seed: int, tag: int,
                hash_block: int = HASH_BLOCK) -> list[Request]:
    """``Request`` objects for ``rows`` (in their order), ids ``{kind}-{unit}-{step}``."""
    hasher = Hasher(tag, seed, hash_block)
    last = {int(u): i for i, u in enumerate(rows.unit.tolist())}  # a unit's last row
    out = []
    columns = zip(rows.unit.tolist(), rows.step.tolist(), rows.arrival.tolist(),
                  rows.prompt.tolist(), rows.output.tolist(), rows.app.tolist(),
                  rows.shared.tolist(), strict=True)
    for i, (unit, step, arrival, prompt, output, app, shared) in enumerate(columns):
        hashes = hasher.row(unit, app, shared, prompt + output)
        if last[unit] == i:
            hasher.forget(unit)  # its rows are made: what is left is held by them
        out.append(Request(f"{kind}-{unit}-{step}", arrival, prompt, output, SLO_OF_KINDS, kind,
                           block_hashes=hashes, hash_block=hash_block))
    return out


def generate(kind: str, qps: float, seed: int, requests: int,
             duration: float | None = None) -> list[Request]:
    """The ``kind``'s requests at ``qps`` on average, sorted by arrival: those arriving in
    [0, ``duration``), or without a duration the first ``requests``."""
    try:
        shape = SHAPES[kind]
    except KeyError:
        raise ValueError(f"unknown workload {kind!r}; choose one of {', '.join(KINDS)}") from None
    if duration is None and requests < 1:
        raise ValueError(f"requests_per_task must be >= 1, got {requests}")
    if duration is not None and not (0 < duration < math.inf):
        raise ValueError(f"duration must be positive and finite, got {duration}")
    rows = draw_rows(shape, qps, seed, duration=duration,
                     count=None if duration is not None else requests)
    return to_requests(kind, rows, seed, shape.tag)


# What each kind draws, as a Table 1 row: SLO, and the mean and std of prompt and output tokens
# over its requests (measured: seed 0, 20,000 requests; tests/test_prefix_workloads.py checks
# them). hfx/evaluation/capacity.py reads the means as the kind's typical request.
TASK_SPECS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec(CHAT, SLO_OF_KINDS, 1184.0, 1547.0, 349.0, 267.0),
        TaskSpec(SHARED, SLO_OF_KINDS, 6950.0, 3217.0, 184.0, 188.0),
        TaskSpec(AGENT, SLO_OF_KINDS, 13298.0, 8162.0, 179.0, 177.0),
    )
}


def repeat_share(requests: Iterable[Request]) -> float:
    """The share of prompt blocks (ceil(prompt / hash_block) a request) whose whole prefix, the
    chain of hashes up to and including it, appeared in an earlier request (arrival order; an
    earlier request's hashes over its output count): the most an infinite cache could hit. A
    request without hashes repeats nothing; chains of different granularities never meet."""
    seen: set[int] = set()
    repeated = total = 0
    for r in sorted(requests, key=lambda r: r.arrival):
        blocks = -(-r.prompt_len // r.hash_block)
        total += blocks
        if r.block_hashes is None:
            continue
        key, hit = r.hash_block, True
        for j, h in enumerate(r.block_hashes):
            key = hash((key, h))
            if hit and j < blocks:
                hit = key in seen
                repeated += hit
            seen.add(key)
    return repeated / total if total else 0.0
