# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""Per-request engine state.

As in vLLM v1, a sequence carries ``num_computed_tokens`` that catches up with ``num_tokens``
(prompt + generated so far). One rule covers prefill, chunked prefill, decode and recompute after
preemption: a step computes some of the missing tokens, and when none are missing the model
samples the next token.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field, fields

from hfx.engine.prefix_cache import CachedUnit
from hfx.sampling import GREEDY, SamplingParams

# The token a simulated executor "samples": it produces timing, not text.
PLACEHOLDER_TOKEN = 0
# A cohort event's tick when none is due (tick_calendar.py): later than any tick.
NO_EVENT = sys.maxsize
# ``Sequence.cross_due`` of a cohort member past its first block crossing: it crosses every
# ``block_size`` ticks from then on, counted by phase (cohort.py), with no calendar event.
IN_PHASE = NO_EVENT - 1


class Role(str, enum.Enum):
    """What an instance does: both phases, or one side of P/D disaggregation (HyperFlexis §5.1)."""

    COLOCATED = "colocated"
    PREFILL = "prefill"  # holds a finished prefill's KV until the request is migrated
    DECODE = "decode"  # accepts requests together with their KV


class RequestStatus(enum.IntEnum):
    """Ordered: every status after PREFILLED is terminal on this instance."""

    WAITING = 0
    RUNNING = 1
    PREFILLED = 2  # prefill role: first token sampled, KV held for migration
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_MIGRATED = 6  # left this instance with its KV
    FINISHED_FAILED = 7  # its step raised in the executor: failed alone, the engine goes on
    # Its stream from a remote server broke: lost here, resumable elsewhere; the
    # instance goes on unless its health check fails too.
    FINISHED_LOST = 8

    @property
    def finished(self) -> bool:
        return self > RequestStatus.PREFILLED


# Finished status → OpenAI finish_reason (None: the request goes on elsewhere).
FINISH_REASON: dict[RequestStatus, str | None] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_MIGRATED: None,
    RequestStatus.FINISHED_FAILED: "error",
    RequestStatus.FINISHED_LOST: "error",  # when it cannot be resumed
}


@dataclass(eq=False, slots=True, init=False)
class Sequence:
    """One request inside one engine. Compared and hashed by identity.

    ``num_tokens`` (prompt + generated) is a maintained field, not a property: the engine reads
    it for every sequence on every step. Change the output through ``append_token`` (the engine
    core's hot loop, ``EngineCore._advance``, inlines it).
    """

    request_id: str
    prompt_len: int
    max_tokens: int
    prompt_token_ids: list[int] | None
    stop_token_ids: frozenset[int]
    sampling: SamplingParams
    output_token_ids: list[int]
    num_computed_tokens: int
    block_table: list[int]  # its blocks' ids, where the engine keeps them (block_manager.py)
    num_blocks: int  # the KV blocks it holds
    status: RequestStatus
    num_preemptions: int
    # The request's TPOT target, for SLO-aware planners (SCORPIO's credits); None if unknown.
    tpot: float | None
    credit: float  # SCORPIO's per-sequence decode credit
    prefill_deadline: float | None  # arrival + TTFT, for deadline-aware planners
    best_effort: bool  # served with leftover capacity, preempted first (SLOs-Serve §4.1)
    next_due: float  # SLOs-Serve pacing: when its next decode token is due
    # When a planner that spends TPOT slack first saw it decode (its first token, near enough).
    first_decode_at: float | None
    # Its place in the engine's running list (admission order), set as it joins that list: the
    # order a per-sequence planner visits it in, which decides preemption victims.
    order: int
    # Its place in the engine's arrival order, set as it first queues (vLLM's arrival_time, as
    # a count): what orders equal priorities in vLLM's priority queue (vllm.py).
    arrival: int
    # A member of the engine's decode cohort (cohort.py): its token fields trail the cohort's
    # counter (num_tokens is cohort_base + the cohort's tick) until synced.
    in_cohort: bool
    cohort_base: int
    # Its content's hashes, per ``hash_block`` tokens (Request.block_hashes), for the prefix
    # cache; None: its token ids, if any, are hashed instead (prefix_cache.py).
    block_hashes: tuple[int, ...] | None
    hash_block: int
    # The block manager's, with prefix caching: its full units' keys (None until looked up) and
    # their size in tokens; the cached units it holds (at the head of its blocks, or in place
    # of a duplicate's); how many of its units were looked up or offered to the cache.
    unit_keys: list[int] | None = field(init=False, repr=False)
    unit_size: int = field(init=False, repr=False)
    units: list[CachedUnit] = field(init=False, repr=False)
    units_seen: int = field(init=False, repr=False)
    # Prompt tokens its first admission found cached here (vLLM's num_cached_tokens).
    num_cached_tokens: int = field(init=False)
    # The cohort ticks of its first block crossing (or IN_PHASE) and of its finish
    # (tick_calendar.py).
    cross_due: int = field(init=False, repr=False)
    finish_due: int = field(init=False, repr=False)
    num_tokens: int = field(init=False)

    # Written out, not generated: mypyc compiles this one, while the ``__init__`` dataclasses
    # generates runs as Python, ~6x the cost of a construction (docs/performance.md).
    def __init__(self, request_id: str, prompt_len: int, max_tokens: int,
                 prompt_token_ids: list[int] | None = None,
                 stop_token_ids: frozenset[int] = frozenset(),
                 sampling: SamplingParams = GREEDY,
                 output_token_ids: list[int] | None = None, num_computed_tokens: int = 0,
                 block_table: list[int] | None = None, num_blocks: int | None = None,
                 status: RequestStatus = RequestStatus.WAITING, num_preemptions: int = 0,
                 tpot: float | None = None, credit: float = 0.0,
                 prefill_deadline: float | None = None, best_effort: bool = False,
                 next_due: float = 0.0, first_decode_at: float | None = None, order: int = 0,
                 arrival: int = 0, in_cohort: bool = False, cohort_base: int = 0,
                 block_hashes: tuple[int, ...] | None = None, hash_block: int = 16) -> None:
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.prompt_token_ids = prompt_token_ids
        self.stop_token_ids = stop_token_ids
        self.sampling = sampling
        self.output_token_ids = [] if output_token_ids is None else output_token_ids
        self.num_computed_tokens = num_computed_tokens
        self.block_table = [] if block_table is None else block_table
        self.num_blocks = len(self.block_table) if num_blocks is None else num_blocks
        self.status = status
        self.num_preemptions = num_preemptions
        self.tpot = tpot
        self.credit = credit
        self.prefill_deadline = prefill_deadline
        self.best_effort = best_effort
        self.next_due = next_due
        self.first_decode_at = first_decode_at
        self.order = order
        self.arrival = arrival
        self.in_cohort = in_cohort
        self.cohort_base = cohort_base
        self.block_hashes = block_hashes
        self.hash_block = hash_block
        self.unit_keys = None
        self.unit_size = 0
        self.units = []
        self.units_seen = 0
        self.num_cached_tokens = 0
        self.cross_due = NO_EVENT
        self.finish_due = NO_EVENT
        self.num_tokens = prompt_len + len(self.output_token_ids)

    def __reduce__(self) -> tuple[type[Sequence], tuple[object, ...], int]:
        # A migrated request's sequence travels to a remote instance, which may run compiled
        # while this one does not (hfx/native.py): through the constructor, one format both
        # ways, then the one field it derives (a cohort member's trails its output).
        return Sequence, tuple(getattr(self, f) for f in _INIT_FIELDS), self.num_tokens

    def __setstate__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.num_tokens += 1

    def migrated_copy(self) -> Sequence:
        """A fresh sequence with this one's progress and no KV blocks, for the instance that
        receives it with its KV (P/D migration)."""
        return Sequence(
            request_id=self.request_id, prompt_len=self.prompt_len, max_tokens=self.max_tokens,
            prompt_token_ids=self.prompt_token_ids, stop_token_ids=self.stop_token_ids,
            sampling=self.sampling,
            output_token_ids=list(self.output_token_ids),
            num_computed_tokens=self.num_computed_tokens, tpot=self.tpot,
            prefill_deadline=self.prefill_deadline, best_effort=self.best_effort,
            block_hashes=self.block_hashes, hash_block=self.hash_block,
        )

    @property
    def num_missing(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        """One token missing after at least one sampled token: a decode step, not a prefill."""
        return self.num_computed_tokens == self.num_tokens - 1 and bool(self.output_token_ids)


_INIT_FIELDS = tuple(f.name for f in fields(Sequence) if f.init)  # in the constructor's order
