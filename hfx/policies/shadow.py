# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The dispatcher's shadow of one instance: what it sent there and what it expects.

Policies never read engines. They keep this estimate instead, updated on each dispatch and each
finished request, and corrected by every Monitor snapshot (HyperFlexis §5.1 step 5: "updates its
local shadow state ... periodic telemetry from the monitor used to correct delayed
observations").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hfx.engine.stats import InstanceStats
from hfx.policies.base import ClusterView, InstanceView
from hfx.policies.output_length import OutputLengthPredictor
from hfx.request import Outcome, Request, RequestRecord
from hfx.tally import Tally

# Steps a measured step length spans: snapshots come more often than steps, and one step alone
# may be a long prefill or a short decode.
STEP_WINDOW = 4


@dataclass(slots=True, init=False)
class _Inflight:
    request: Request
    predicted_output: float
    guarded: bool  # its TPOT counts in min_tpot (a policy may keep only some: hfx.py)

    def __init__(self, request: Request, predicted_output: float, guarded: bool) -> None:
        # Written out, as request.py's: compiled, one made per dispatch runs no Python.
        self.request, self.predicted_output = request, predicted_output
        self.guarded = guarded


@dataclass(slots=True)
class ShadowInstance:
    id: int
    kv_capacity_tokens: int
    max_num_seqs: int
    inflight: dict[str, _Inflight] = field(default_factory=dict)
    # Σ l_cur of the running batch (prompt + generated), from the last snapshot, plus prompts
    # dispatched since and minus requests finished since.
    decode_ctx: float = 0.0
    # KV tokens that in-flight requests will hold when they finish (prompt + predicted output).
    reserved_tokens: float = 0.0
    # Snapshot's KV use beyond our reservations' prompt part: corrects for drift.
    kv_used_tokens: float = 0.0
    # The engine's mean step length over its last few steps, measured from snapshots (busy
    # time over steps); 0 until measured. On a chunked-prefill engine a step carries prompts
    # beside the decodes, so it is longer than Eq. 2's decode step.
    step: float = 0.0
    _tpots: Tally = field(default_factory=Tally)
    _ttfts: Tally = field(default_factory=Tally)
    _step_anchor: tuple[float, int] | None = None  # (busy time, steps) the step is measured from
    # Moves with every change to what a prediction here reads (add, remove, correct), so a
    # prediction can be kept until it does.
    version: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.inflight)

    @property
    def idle(self) -> bool:
        return not self.inflight

    def tpot_demand(self) -> float:
        """Σ 1/TPOT over the guarded in-flight requests: tokens per second their targets ask
        for."""
        return self._tpots.inverse_sum()

    def min_tpot(self) -> float | None:
        return self._tpots.tightest()

    def min_ttft(self) -> float | None:
        return self._ttfts.tightest()

    def free_slots(self) -> int:
        """Sequences the engine could still run at once (its ``max_num_seqs``)."""
        return self.max_num_seqs - len(self.inflight)

    def free_kv_tokens(self) -> float:
        """KV tokens not yet promised: capacity minus every in-flight request's full length."""
        return self.kv_capacity_tokens - max(self.reserved_tokens, self.kv_used_tokens)

    def add(self, request: Request, predicted_output: float, guarded: bool = True) -> None:
        """``request`` sent here; ``guarded`` False leaves its TPOT out of ``min_tpot``."""
        assert request.slo is not None
        self.version += 1
        self.inflight[request.id] = _Inflight(request, predicted_output, guarded)
        self.decode_ctx += request.prompt_len
        self.reserved_tokens += request.prompt_len + predicted_output
        self.kv_used_tokens += request.prompt_len
        if guarded:
            self._tpots.add(request.slo.tpot)
        self._ttfts.add(request.slo.ttft)

    def remove(self, request_id: str, tokens_at_finish: int) -> bool:
        """A request left; ``tokens_at_finish`` is its prompt + generated length. False if it
        was not here."""
        item = self.inflight.pop(request_id, None)
        if item is None:
            return False
        req = item.request
        assert req.slo is not None  # add() took only requests with one
        self.version += 1
        self.decode_ctx = max(0.0, self.decode_ctx - tokens_at_finish)
        self.reserved_tokens = max(0.0, self.reserved_tokens - req.prompt_len
                                   - item.predicted_output)
        self.kv_used_tokens = max(0.0, self.kv_used_tokens - tokens_at_finish)
        if item.guarded:
            self._tpots.discard(req.slo.tpot)
        self._ttfts.discard(req.slo.ttft)
        return True

    def correct(self, stats: InstanceStats) -> None:
        """Take the measured decode context and KV use from a Monitor snapshot."""
        self.version += 1
        self.decode_ctx = float(stats.decode_ctx)
        self.kv_used_tokens = float(stats.kv_used_blocks * stats.block_size)
        anchor = self._step_anchor
        if anchor is None or stats.num_steps < anchor[1]:  # first sight, or a restarted engine
            self._step_anchor = (stats.busy_time, stats.num_steps)
        elif stats.num_steps - anchor[1] >= STEP_WINDOW:
            self.step = (stats.busy_time - anchor[0]) / (stats.num_steps - anchor[1])
            self._step_anchor = (stats.busy_time, stats.num_steps)


class Shadows:
    """The shadows of every instance a policy has seen: created on first sight, corrected by
    each new Monitor snapshot, and told when requests finish."""

    def __init__(self) -> None:
        self._by_id: dict[int, ShadowInstance] = {}
        self._corrected_at: dict[int, float] = {}
        self._followed: tuple[ClusterView, int] | None = None  # the view version synced last

    def __getitem__(self, instance_id: int) -> ShadowInstance:
        return self._by_id[instance_id]

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._by_id

    def get(self, instance_id: int) -> ShadowInstance | None:
        return self._by_id.get(instance_id)

    def follow(self, view: ClusterView, targets: list[InstanceView]) -> bool:
        """Sync every target when ``view``'s version has moved since the last call (a
        snapshot, a drain, a join or a leave); returns whether it had. Snapshots change only
        with the version, so this is ``sync`` of every target without the O(N) per call."""
        last = self._followed
        if last is not None and last[0] is view and last[1] == view.version:
            return False
        for inst in targets:
            self.sync(inst)
        self._followed = (view, view.version)
        return True

    def sync(self, inst: InstanceView) -> ShadowInstance:
        """The shadow of ``inst``, created if new and corrected if its snapshot is newer."""
        sh = self._by_id.get(inst.id)
        stats = inst.stats
        if sh is None:
            sh = self._by_id[inst.id] = ShadowInstance(
                inst.id, stats.kv_total_blocks * stats.block_size, stats.max_num_seqs)
        if self._corrected_at.get(inst.id) != stats.time:
            sh.correct(stats)
            self._corrected_at[inst.id] = stats.time
        return sh

    def finished(self, record: RequestRecord, instance_id: int | None,
                 predictor: OutputLengthPredictor) -> ShadowInstance | None:
        """Learn the output length of a finished request and drop it from the shadow of
        ``instance_id``; returns that shadow if the request was in it."""
        req = record.request
        if record.outcome is Outcome.FINISHED:
            predictor.observe(req.task, record.num_tokens)
        sh = self._by_id.get(instance_id) if instance_id is not None else None
        if sh is None or not sh.remove(req.id, req.prompt_len + record.num_tokens):
            return None
        return sh
