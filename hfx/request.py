# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Domain model: SLOs, requests, and the record of what happened to each request.

Attainment follows HyperFlexis Eq. 4: a request meets its SLO when its TTFT is met AND its mean
TPOT is met. The deadline-based variant (PolyServe §2.3, "DSLO") requires token i (0-based) to
exist by arrival + TTFT + i·TPOT; it is reported beside Eq. 4.
"""

from __future__ import annotations

import enum
import math
from array import array
from dataclasses import dataclass

from hfx.sampling import GREEDY, SamplingParams


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives in seconds: time to first token and time per output token."""

    ttft: float
    tpot: float

    def __post_init__(self) -> None:
        if not (0 < self.ttft < math.inf and 0 < self.tpot < math.inf):  # NaN fails too
            raise ValueError(f"SLO targets must be positive and finite, got ttft={self.ttft}, "
                             f"tpot={self.tpot}")

    def __reduce__(self) -> tuple[type[SLO], tuple[float, float]]:
        # Through the constructor: compiled (hfx/native.py), a frozen class cannot be unpickled
        # field by field.
        return SLO, (self.ttft, self.tpot)


DEFAULT_TENANT = "default"  # a request that names no tenant


@dataclass(slots=True, init=False)
class Request:
    """One LLM request as the control plane sees it.

    ``max_tokens`` is the number of tokens to generate; in simulation it is the trace's output
    length, so a request finishes by length. ``priority`` is 0 for the most important class
    (HyperFlexis §5.2; other systems use the opposite direction).
    """

    id: str
    arrival: float
    prompt_len: int
    max_tokens: int
    slo: SLO | None
    task: str
    priority: int | None
    prompt_token_ids: list[int] | None
    # For a real executor: how to sample, and token ids that end the output (EOS, stop words).
    sampling: SamplingParams
    stop_token_ids: frozenset[int]
    # Its content, block by block (issue 46): one hash per ``hash_block`` tokens, in order, as
    # Mooncake's ``hash_ids`` (512-token blocks). Equal hashes at equal positions mean equal
    # content; the engine chains them (hfx/engine/prefix_cache.py), so an entry need not name
    # its prefix. They cover the prompt (the last entry may cover a partial block) and may go on
    # over the output, so that a finished turn's answer is cached for the next. None: nothing
    # known, nothing matched (Azure and BurstGPT traces, task sets); a real engine hashes the
    # token ids itself.
    block_hashes: tuple[int, ...] | None
    hash_block: int
    # Whose it is (an API key's owner, the x-tenant header, a trace's tenant column): the unit
    # of fair shares (hfx/cluster/fair_share.py).
    tenant: str
    # Its start tag among the tenants' requests (fair_share.py), set at submission when fair
    # shares are on; a queue that honours it serves a class in tag order. None: arrival order.
    fair_tag: float | None

    # The hot dataclasses write their ``__init__`` out: mypyc compiles it, while the one
    # dataclasses generates runs as Python, ~6x the cost of a construction (docs/performance.md).
    def __init__(self, id: str, arrival: float, prompt_len: int, max_tokens: int,
                 slo: SLO | None = None, task: str = "default", priority: int | None = None,
                 prompt_token_ids: list[int] | None = None, sampling: SamplingParams = GREEDY,
                 stop_token_ids: frozenset[int] = frozenset(),
                 block_hashes: tuple[int, ...] | None = None, hash_block: int = 16,
                 tenant: str = DEFAULT_TENANT, fair_tag: float | None = None) -> None:
        if prompt_len < 1:
            raise ValueError(f"request {id}: prompt_len must be >= 1, got {prompt_len}")
        if max_tokens < 1:
            raise ValueError(f"request {id}: max_tokens must be >= 1, got {max_tokens}")
        self.id = id
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.slo = slo
        self.task = task
        self.priority = priority
        self.prompt_token_ids = prompt_token_ids
        self.sampling = sampling
        self.stop_token_ids = stop_token_ids
        if block_hashes is not None:
            check_block_hashes(id, prompt_len, max_tokens, len(block_hashes), hash_block)
        self.block_hashes = block_hashes
        self.hash_block = hash_block
        self.tenant = tenant
        self.fair_tag = fair_tag

    def __reduce__(self) -> tuple[type[Request], tuple[object, ...]]:
        # Through the constructor, in one format as Python and compiled (hfx/native.py): it
        # travels to front processes and Ray actors, which may run the other way.
        return Request, tuple(getattr(self, f) for f in _REQUEST_FIELDS)


def check_block_hashes(id: str, prompt_len: int, max_tokens: int, count: int,
                       hash_block: int) -> None:
    """Raise ValueError unless ``count`` hashes of ``hash_block`` tokens cover the prompt and
    no more than prompt and output."""
    if hash_block < 1:
        raise ValueError(f"request {id}: hash_block must be >= 1, got {hash_block}")
    low, high = -(-prompt_len // hash_block), -(-(prompt_len + max_tokens) // hash_block)
    if not low <= count <= high:
        raise ValueError(f"request {id}: {count} block hashes of {hash_block} tokens do not "
                         f"cover its {prompt_len} prompt tokens (need {low}"
                         + (f" to {high}" if high > low else "") + ")")


class Outcome(enum.Enum):
    """Terminal state of a request at the control plane."""

    PENDING = "pending"  # not terminal yet
    FINISHED = "finished"
    REJECTED = "rejected"  # a policy declined it; counted as an SLO miss
    ABORTED = "aborted"  # the client went away
    FAILED = "failed"  # an error on the serving path
    SHED = "shed"  # admission control turned it away: queue full, or waited too long


@dataclass(slots=True, init=False)
class TokenRun:
    """Tokens a simulated engine's decode cohort produced for one request (cohort.py): the
    times of ticks ``start`` to ``end`` (exclusive; None while it still decodes there) in the
    instance's tick log, coming after the first ``at`` tokens of the record's ``token_times``.
    The ledger appends one time per tick to the log, not one per token to each record."""

    at: int
    log: array
    start: int
    end: int | None

    def __init__(self, at: int, log: array, start: int, end: int | None = None) -> None:
        self.at, self.log, self.start, self.end = at, log, start, end  # compiled (see Request)

    def __len__(self) -> int:
        return (len(self.log) if self.end is None else self.end) - self.start

    def __reduce__(self) -> tuple[type[TokenRun], tuple[int, array, int, int | None]]:
        return TokenRun, (self.at, self.log, self.start, self.end)  # as Request's


@dataclass(slots=True, init=False)
class RequestRecord:
    """What happened to one request: times are seconds on the loop's clock."""

    request: Request
    dispatch_time: float | None
    instance: int | None  # where it was placed (the prefill instance in P/D)
    decode_instance: int | None  # P/D: where it decoded after migration
    migrated_at: float | None  # P/D: when its KV arrived on the decode instance
    token_times: array
    finish_time: float | None
    outcome: Outcome
    # The SLO the dispatcher was given (explicit, or mapped from a priority by HFX-PM)...
    slo: SLO | None
    # ...and the SLO attainment is scored against: the explicit one, or for a priority request
    # the nominal SLO of its priority (HyperFlexis §9.1: mapping "configured to satisfy" targets).
    target: SLO | None
    best_effort: bool  # the policy knew the SLO was already lost when it placed it
    error: str | None  # why the request failed or was rejected
    # Sampled token ids (real executors only; None in simulation): what a retry resumes from.
    output_ids: list[int] | None
    retries: int  # times it was resumed elsewhere after its instance failed
    # Tokens not (yet) in ``token_times``: runs of a simulated decode cohort, copied in when the
    # request ends (``close_runs``). Read the times through ``times()`` before then.
    runs: list[TokenRun] | None
    seq: int  # the order the ledger opened it in: the metrics' order (RecordFold)
    # Prompt tokens its engine found in its prefix cache when it was first admitted there.
    cached_tokens: int

    def __init__(self, request: Request, dispatch_time: float | None = None,
                 instance: int | None = None, decode_instance: int | None = None,
                 migrated_at: float | None = None, token_times: array | None = None,
                 finish_time: float | None = None, outcome: Outcome = Outcome.PENDING,
                 slo: SLO | None = None, target: SLO | None = None, best_effort: bool = False,
                 error: str | None = None, output_ids: list[int] | None = None,
                 retries: int = 0, runs: list[TokenRun] | None = None, seq: int = 0,
                 cached_tokens: int = 0) -> None:
        self.request = request  # compiled (see Request)
        self.dispatch_time = dispatch_time
        self.instance = instance
        self.decode_instance = decode_instance
        self.migrated_at = migrated_at
        self.token_times = array("d") if token_times is None else token_times
        self.finish_time = finish_time
        self.outcome = outcome
        self.slo = request.slo if slo is None else slo
        self.target = request.slo if target is None else target
        self.best_effort = best_effort
        self.error = error
        self.output_ids = output_ids
        self.retries = retries
        self.runs = runs
        self.seq = seq
        self.cached_tokens = cached_tokens

    def __reduce__(self) -> tuple[type[RequestRecord], tuple[object, ...]]:
        return RequestRecord, tuple(getattr(self, f) for f in _RECORD_FIELDS)  # as Request's

    @property
    def queue_time(self) -> float | None:
        """Time from arrival to dispatch."""
        return None if self.dispatch_time is None else self.dispatch_time - self.request.arrival

    def times(self) -> array:
        """Every token's time, in order (``token_times`` with the open runs spliced in)."""
        runs, own = self.runs, self.token_times
        if not runs:
            return own
        out, prev = array("d"), 0
        for run in runs:
            out += own[prev:run.at]
            out += run.log[run.start:len(run.log) if run.end is None else run.end]
            prev = run.at
        out += own[prev:]
        return out

    def close_runs(self) -> None:
        """Copy the runs' times into ``token_times`` (the request has ended)."""
        if self.runs:
            self.token_times = self.times()
        self.runs = None

    @property
    def first_token_time(self) -> float | None:
        times = self.times()
        return times[0] if times else None

    @property
    def num_tokens(self) -> int:
        runs = self.runs
        return len(self.token_times) + (sum(map(len, runs)) if runs else 0)

    @property
    def ttft(self) -> float | None:
        first = self.first_token_time
        return None if first is None else first - self.request.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (0 for a one-token output)."""
        times = self.times()
        n = len(times)
        if n == 0:
            return None
        if n == 1:
            return 0.0
        return (times[-1] - times[0]) / (n - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.request.arrival

    def meets_slo(self) -> bool:
        """HyperFlexis Eq. 4: TTFT met and mean TPOT met; an unfinished request misses."""
        if self.outcome is not Outcome.FINISHED or self.target is None:
            return False
        ttft, tpot = self.ttft, self.tpot
        assert ttft is not None and tpot is not None
        return ttft <= self.target.ttft and tpot <= self.target.tpot

    def meets_deadline_slo(self) -> bool:
        """PolyServe §2.3: token i (0-based) produced by arrival + TTFT + i·TPOT."""
        if self.outcome is not Outcome.FINISHED or self.target is None:
            return False
        import numpy as np  # here, not at module import: the CLI imports this module

        times = np.frombuffer(self.times(), dtype=np.float64)
        target = self.target
        deadlines = self.request.arrival + target.ttft + target.tpot * np.arange(len(times))
        return bool(np.all(times <= deadlines))


# Every field, in the constructor's order (each is an ``__init__`` argument).
_REQUEST_FIELDS = tuple(Request.__dataclass_fields__)
_RECORD_FIELDS = tuple(RequestRecord.__dataclass_fields__)
