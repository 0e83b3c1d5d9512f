# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``polyserve``: PolyServe (PolyServe) as a policy, colocated mode.

- Binning (§4.2): one queue per TPOT tier, earliest deadline (arrival + TTFT) first. TPOTs
  at or above the engine's saturated step (a decode of ``max_num_seqs`` sequences over a full
  KV cache: no batch the engine can run is slower) are one tier, as §5.1's tiers stop where
  "100ms is enough for saturating the engine performance": a looser target buys nothing more.
- Instances belong to a tier or to the idle pool; all start idle. A tier with pending requests
  takes an idle instance (§4.3; joining a tier is instant, as the seed assumes).
- Routing (§4.5, §4.6): a request goes to the *highest-load* instance of its tier that can still
  meet its SLO — building the load gradient that lets the last instance empty out. Failing that
  (the tier is full), an idle or pending-list instance joins the tier; failing that, lazy
  promotion (§4.4): an instance of a tighter tier, nearest tier first; else the request waits.
  (Promoting before taking an idle instance, our first reading, let looser tiers fill the
  tightest tier's instances and starved it: four-task on 4 instances attained 0.50.)
- Admission check on an instance: predicted iteration time from a (batch size, KV size) table
  (``IterationTable``, built from the step-time profile), at the most KV the instance holds over
  the new request's predicted life (average output length), its requests growing a token an
  iteration and each exiting at its own predicted end (§4.5: it "simulates future iterations
  and computes the maximum KV cache size as requests grow in length, and exits when finished";
  ``_Exits``; the tokens the snapshot shows generated, shared out by time since placement); it
  must stay within the instance's tier TPOT (``kv_future="grow"``, our first reading: every
  request grows through the new one's life, none exits) and leave a prefill chunk of at least
  ``min_chunk`` tokens. TTFT: continuous chunked-prefill prediction — the rest of the current
  iteration (wait time), then one iteration per chunk for the prompts queued there and this
  one, within arrival + TTFT.
- Scale down (§4.3, §4.4): an instance with nothing in flight returns to the idle pool; one that
  runs only other tiers' requests is on the pending list, free to join a tier that needs one.
- Inside an instance: continuous batching with dynamic chunking (planner ``tpot-chunked``).
- Deadline-based SLO attainment (§2.3) is reported for every run as ``attainment_dslo``.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from hfx.engine.planners.slo_paced import time2bs
from hfx.engine.planners.tpot_chunked import TPOTChunkedPlanner
from hfx.engine.stats import InstanceStats
from hfx.policies.base import (
    ClusterView,
    Decision,
    Dispatch,
    InstanceView,
    Policy,
    ttft_lost,
)
from hfx.policies.output_length import OutputLengthPredictor
from hfx.policies.shadow import ShadowInstance, Shadows
from hfx.request import Request, RequestRecord
from hfx.stepmodel.latency import StepTimeModel


class IterationTable:
    """Iteration time by (batch size, KV tokens), interpolated bilinearly on a profiled grid
    (PolyServe §4.5). Built from a step-time model; a measured table can replace ``times``."""

    BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    KV = (0, 1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000, 4_000_000)

    def __init__(self, model: StepTimeModel) -> None:
        self.times = [[model.decode_time(kv, b) for kv in self.KV] for b in self.BATCH]
        # Batch sizes are integers: their cells, looked up rather than searched.
        cells = [_locate(self.BATCH, b) for b in range(self.BATCH[-1] + 1)]
        self._batch_cell = [i for i, _ in cells]
        self._batch_frac = [f for _, f in cells]
        self._kv = [float(k) for k in self.KV]  # a list: compiled, a fixed tuple is boxed per use

    def time(self, batch: int, kv: float) -> float:
        """The interpolated iteration time. Called several times per placement attempt (the
        hot path of a polyserve run): a method, not ``__call__``, and no tuple per lookup, so
        that compiled it is a native call (31% of a 16-instance probe before, 6% after)."""
        if 0 <= batch < len(self._batch_cell):
            i, fb = self._batch_cell[batch], self._batch_frac[batch]
        else:
            i, fb = _locate(self.BATCH, batch)
        grid = self._kv
        j = min(max(bisect.bisect_right(grid, kv) - 1, 0), len(grid) - 2)
        fk = min(max((kv - grid[j]) / (grid[j + 1] - grid[j]), 0.0), 1.0)
        low_row, high_row = self.times[i], self.times[i + 1]
        low = low_row[j] * (1 - fk) + low_row[j + 1] * fk
        high = high_row[j] * (1 - fk) + high_row[j + 1] * fk
        return low * (1 - fb) + high * fb


def _locate(grid: tuple, x: float) -> tuple[int, float]:
    """The grid cell holding ``x`` and where in it (0..1, clamped at the grid's ends)."""
    i = min(max(bisect.bisect_right(grid, x) - 1, 0), len(grid) - 2)
    return i, min(max((x - grid[i]) / (grid[i + 1] - grid[i]), 0.0), 1.0)


class TierMap(dict[int, float | None]):
    """instance → its TPOT tier (None: the idle pool), with a ``version`` that moves on every
    change, so what PolyServe derives from it can be kept until it moves."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        super().__init__()
        self.version = 0

    def __setitem__(self, key: int, value: float | None) -> None:
        super().__setitem__(key, value)
        self.version += 1

    def setdefault(self, key: int, default: float | None = None) -> float | None:
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: int, *default: float | None) -> float | None:  # type: ignore[override]
        self.version += 1
        return super().pop(key, *default)


@dataclass(slots=True)
class _Stuck:
    """A tier's last walk, which placed nothing (``PolyServe._still_stuck``)."""

    epoch: int
    ids: list[str]  # the requests it walked, in queue order
    lost: list[bool]  # whether each one's TTFT was lost then
    whole: bool  # it walked the whole queue


KV_FUTURES = ("exits", "grow")
# Iterations left, binned: a request is taken to exit at its bin's upper edge (at most 25%
# late, so the KV is never under-counted), which keeps a rebuild to one pass with no sort.
_EDGES: tuple[float, ...] = (*sorted({math.ceil(1.25 ** k) for k in range(44)}), math.inf)


class _Exits:
    """An instance's running requests as PolyServe §4.5 sees them over the future: each
    grows a token an iteration and exits after its predicted output; ``peak`` is the most KV
    they and a new request hold while the new one runs. Requests join and leave one at a time
    (``join``, ``leave``) between rebuilds."""

    __slots__ = ("alive_from", "at", "count", "ctx", "ctx_from", "peaks", "rows", "version")

    def __init__(self, version: int, at: float) -> None:
        self.version, self.at = version, at
        nb = len(_EDGES)
        self.count = [0] * nb  # requests per bin of iterations left
        self.ctx = [0.0] * nb  # the KV they hold now
        self.rows: dict[str, tuple[int, float]] = {}  # request → (its bin, the KV it holds)
        self.alive_from = [0] * (nb + 1)
        self.ctx_from = [0.0] * (nb + 1)
        self.peaks = [0.0] * nb

    def join(self, request_id: str, remaining: float, held: float) -> None:
        """A request with ``remaining`` iterations left holding ``held`` KV tokens; ``fold``
        before the next ``peak``."""
        b = bisect.bisect_left(_EDGES, remaining)
        self.rows[request_id] = (b, held)
        self.count[b] += 1
        self.ctx[b] += held

    def leave(self, request_id: str) -> None:
        row = self.rows.pop(request_id, None)
        if row is not None:
            b, held = row
            self.count[b] -= 1
            self.ctx[b] -= held

    def fold(self) -> None:
        """The sums ``peak`` reads, over the bins (a few dozen, whatever the batch)."""
        count, ctx, edges = self.count, self.ctx, _EDGES
        nb = len(edges)
        # alive_from[b], ctx_from[b]: the requests of bins b.. (exiting at edges[b] or later)
        # and the KV they hold now.
        alive_from, ctx_from = self.alive_from, self.ctx_from
        for b in range(nb - 1, -1, -1):
            alive_from[b] = alive_from[b + 1] + count[b]
            ctx_from[b] = ctx_from[b + 1] + ctx[b]
        # peaks[b]: the most KV before edges[b], the new request's own growth counted in (its
        # prompt is added by ``peak``). Between two exits the KV only grows: the peaks are just
        # before each.
        peaks = self.peaks
        best = peaks[0] = ctx_from[0]
        for b in range(nb - 1):
            if count[b]:
                best = max(best, ctx_from[b] + (alive_from[b] + 1) * edges[b])
            peaks[b + 1] = best

    def peak(self, prompt: int, life: float) -> float:
        """The largest KV over the ``life`` iterations of a new request of ``prompt``
        tokens: just before each exit within its life, or at its end."""
        k = bisect.bisect_left(_EDGES, life)  # bins 0..k-1 exit before its end
        end = self.ctx_from[k] + (self.alive_from[k] + 1) * life
        return prompt + max(self.peaks[k], end)


class PolyServe(Policy):
    name = "polyserve"
    planner = TPOTChunkedPlanner.name

    def __init__(self, min_chunk: int = 64, max_misses: int = 8,
                 output_length: str = "history", kv_future: str = "exits") -> None:
        if kv_future not in KV_FUTURES:
            raise ValueError(f"polyserve kv_future must be one of {', '.join(KV_FUTURES)}, "
                             f"got {kv_future!r}")
        self.min_chunk = int(min_chunk)
        # How the admission check sees the KV over a new request's life: "exits" (§4.5, each
        # request exiting at its predicted end) or "grow" (every one growing through it, none
        # exiting: our first reading, more conservative; tuning chooses).
        self.kv_exits = kv_future == "exits"
        # Requests of one tier that may fail to place in one call before the rest of the tier
        # waits for the next (bounds a call's work; the tier is in deadline order).
        self.max_misses = int(max_misses)
        self.predictor = OutputLengthPredictor(output_length)
        self.shadow = Shadows()
        self.tier_of = TierMap()  # instance → TPOT tier, None = idle pool
        self._queues: dict[float, list[tuple[float, str, Request]]] = defaultdict(list)
        self._own: dict[int, int] = defaultdict(int)  # in-flight requests of its own tier
        self._counted: dict[str, int] = {}  # the requests ``_own`` counts → their instance
        # Prompts dispatched since each instance's last Monitor snapshot: (time, tokens), and
        # their sum; pruned when a new snapshot arrives, not on every call.
        self._recent: dict[int, list[tuple[float, int]]] = defaultdict(list)
        self._recent_tokens: dict[int, int] = defaultdict(int)
        self._stats_time: dict[int, float] = {}
        self._waiting_tokens: dict[int, int] = {}
        self._table: IterationTable | None = None
        self._model: StepTimeModel | None = None
        self._saturated = math.inf  # the engine's saturated step time, once a view shows it
        # A placement that missed misses again until something it reads moves: a snapshot or a
        # membership change, a dispatch, a finish, the model, a tier; or its request's TTFT is
        # lost (then it is placed for its TPOT alone). ``_moves`` counts those moves (with the
        # tiers' version: ``_epoch``); ``_stuck`` keeps, per tier whose last walk placed
        # nothing, the epoch and the requests it walked, so a call that would walk the same
        # requests against the same state skips the tier: its decision would be the same (in
        # overload most calls were such walks).
        self._moves = 0
        self._stuck: dict[float, _Stuck] = {}
        # When each in-flight request was placed (its progress since), and each instance's
        # requests as they grow and exit (``_exits``).
        self._placed_at: dict[str, float] = {}
        self._exit_cache: dict[int, _Exits] = {}
        # What a call reads and events rarely change, kept between calls: each tier's
        # instances (and the tiers' version and view version they are of), the instances
        # accepting work, and those that finished a request since the last call.
        self._by_tier: dict[float, list[InstanceView]] = {}
        self._by_tier_of: tuple[int, ClusterView | None, int] = (-1, None, -1)
        self._accepting: set[int] = set()
        self._touched: set[int] = set()
        self._tiers_seen = -1  # the tiers' version this policy left them at (the last call)

    def tier(self, tpot: float) -> float:
        """The TPOT tier of a request with this TPOT target."""
        return min(tpot, self._saturated)

    def enqueue(self, request: Request, now: float) -> None:
        assert request.slo is not None  # the control plane gives every request one
        bisect.insort(self._queues[self.tier(request.slo.tpot)],
                      (request.arrival + request.slo.ttft, request.id, request))

    def _saturate(self, model: StepTimeModel, stats: InstanceStats) -> None:
        """Learn the engine's saturated step time; merge the queues it makes one tier."""
        saturated = model.decode_time(stats.kv_total_blocks * stats.block_size,
                                      stats.max_num_seqs)
        if saturated == self._saturated:
            return
        self._saturated = saturated
        for tpot in [t for t in self._queues if self.tier(t) != t]:
            merged = self._queues[self.tier(tpot)]
            merged.extend(self._queues.pop(tpot))
            merged.sort()

    def num_queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def withdraw(self, request_id: str) -> bool:
        for queue in self._queues.values():
            for i, item in enumerate(queue):
                if item[1] == request_id:
                    del queue[i]  # the rest stays in deadline order
                    return True
        return False

    # ---- the admission check -------------------------------------------------------------
    def queued_prefill(self, iid: int) -> int:
        """Prompt tokens not yet prefilled: waiting at the last snapshot, plus those sent since
        (prompts sent before the snapshot are dropped from the list in ``schedule``)."""
        return self._waiting_tokens.get(iid, 0) + self._recent_tokens[iid]

    def fits(self, sh: ShadowInstance, tier: float, req: Request, now: float,
             ttft: bool = True) -> bool:
        """Can ``sh`` (serving ``tier``) take ``req`` within its TPOT, KV and — unless ``ttft``
        is False — TTFT?"""
        model, table = self._model, self._table
        assert model is not None and table is not None and req.slo is not None
        if self.tier(req.slo.tpot) < tier or sh.free_slots() <= 0:  # the cheap refusals first
            return False
        out_len = self.predictor.predict(req)
        batch = sh.batch_size + 1
        if self.kv_exits:
            kv_max = self._exits(sh).peak(req.prompt_len, out_len)
        else:
            kv_max = sh.decode_ctx + req.prompt_len + batch * out_len
        if table.time(batch, kv_max) > tier:
            return False
        if req.prompt_len + out_len > sh.free_kv_tokens():
            return False
        chunk = time2bs(model, tier, kv_max, batch)
        if chunk < self.min_chunk:
            return False  # the chunk size could not be kept up through the prefill
        # Continuous chunked-prefill prediction: the rest of the iteration in progress (wait
        # time), then one iteration per chunk of the prompts queued here and this one; each
        # costs the decode step plus its prompt tokens.
        tokens = self.queued_prefill(sh.id) + req.prompt_len
        chunks = math.ceil(tokens / chunk)
        step = table.time(batch, sh.decode_ctx)
        first_token = now + table.time(max(1, sh.batch_size), sh.decode_ctx) + chunks * step \
            + model.prefill_b * tokens
        return not ttft or first_token <= req.arrival + req.slo.ttft

    def _exits(self, sh: ShadowInstance) -> _Exits:
        """``sh``'s requests as they grow and exit (``_Exits``), built at each snapshot and
        kept while requests join (``_joined``) and leave (``on_finished``) between snapshots;
        built again if the shadow moved otherwise. What they have generated is the
        snapshot's: its context less their prompts, shared out by how long each has been
        placed (a request placed since the snapshot has generated nothing). ``_epoch`` moves
        with every such change, so a stuck tier's walk stays the same until one does."""
        at = self._stats_time.get(sh.id, 0.0)
        kept = self._exit_cache.get(sh.id)
        if kept is not None and kept.version == sh.version and kept.at == at:
            return kept
        placed_at = self._placed_at
        items = list(sh.inflight.items())
        ages = [max(0.0, at - placed_at.get(rid, at)) for rid, _ in items]
        prompts = sum(item.request.prompt_len for _, item in items)
        total_age = sum(ages)
        share = max(0.0, sh.decode_ctx - prompts) / total_age if total_age > 0 else 0.0
        exits = _Exits(sh.version, at)
        for (rid, item), age in zip(items, ages, strict=True):
            done = age * share
            # One past its predicted length is taken to end at the next iteration, holding
            # all it has grown to.
            exits.join(rid, max(1.0, item.predicted_output - done), item.request.prompt_len + done)
        exits.fold()
        self._exit_cache[sh.id] = exits
        return exits

    def _joined(self, sh: ShadowInstance, request: Request, version: int) -> None:
        """``request`` was just added to ``sh`` (from shadow version ``version``): if its
        exits were current, it joins them with all its predicted output ahead."""
        exits = self._exit_cache.get(sh.id)
        if exits is not None and exits.version == version:
            exits.join(request.id, max(1.0, sh.inflight[request.id].predicted_output),
                       request.prompt_len)
            exits.fold()
            exits.version = sh.version

    def _place(self, req: Request, candidates: list[InstanceView], now: float,
               lost: bool) -> InstanceView | None:
        """The highest-load candidate that fits its own tier's TPOT (the load gradient). A
        request whose TTFT is ``lost`` whatever happens is placed for its TPOT alone: it misses,
        but it is served, never left waiting forever. ``candidates``: the tier's instances with
        a free slot (a full one fails ``fits`` first thing; ``_open``)."""
        shadow = self.shadow
        for inst in sorted(candidates, key=lambda i: (-shadow[i.id].batch_size, i.id)):
            tier = self.tier_of[inst.id]
            assert tier is not None
            if self.fits(shadow[inst.id], tier, req, now, ttft=not lost):
                return inst
        return None

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        now = view.now
        targets = view.accepting()
        if not targets:
            return decision
        if self._model is not view.step_model:
            self._model, self._table = view.step_model, IterationTable(view.step_model)
            self._saturate(view.step_model, targets[0].stats)
            self._moves += 1
        touched: Iterable[int] = self._touched
        if self.shadow.follow(view, targets):  # snapshots or membership moved
            self._moves += 1
            self._accepting = {target.id for target in targets}
            touched = self._accepting
            for target in targets:
                self.tier_of.setdefault(target.id, None)
                if self._stats_time.get(target.id) != target.stats.time:  # a new snapshot
                    self._new_snapshot(target)
        elif self.tier_of.version != self._tiers_seen:  # tiers set from outside: check all
            touched = self._accepting
        self._scale_down(touched)
        self._touched = set()
        by_tier = self._members(view, targets)
        # Per tier, its instances with a free slot, as this call's dispatches leave them.
        open_in: dict[float, list[InstanceView]] = {}
        tiers = sorted(t for t, q in self._queues.items() if q)
        for tier in tiers:
            queue = self._queues[tier]
            if self._still_stuck(tier, queue, now):
                continue
            epoch = self._epoch()
            waiting: list[tuple[float, str, Request]] = []
            walked_lost: list[bool] = []  # each looked-at request's: whether its TTFT is lost
            misses = 0
            looked = 0
            for item in queue:
                if misses >= self.max_misses:  # later requests of the tier wait for next time
                    break
                looked += 1
                req = item[2]
                lost = ttft_lost(req, self._model, now)
                walked_lost.append(lost)
                inst: InstanceView | None = self._place(
                    req, self._open(open_in, by_tier, tier), now, lost)
                if inst is None:  # the tier is full: an idle (or pending-list) instance joins
                    spare = [i for i in targets if self.tier_of[i.id] is None] or [
                        i for i in targets if self.tier_of[i.id] is not None
                        and self._own[i.id] == 0 and self.tier_of[i.id] != tier]
                    for cand in spare:
                        if self.fits(self.shadow[cand.id], tier, req, now, ttft=not lost):
                            self.tier_of[cand.id] = tier
                            by_tier = self._members(view, targets)
                            open_in.clear()
                            inst = cand
                            break
                if inst is None:  # no instance to add: lazy promotion, nearest tighter first
                    for tighter in sorted((t for t in set(self.tier_of.values())
                                           if t is not None and t < tier), reverse=True):
                        inst = self._place(req, self._open(open_in, by_tier, tighter), now,
                                           lost)
                        if inst is not None:
                            break
                if inst is None:
                    waiting.append(item)
                    misses += 1
                    continue
                decision.dispatch.append(Dispatch(req, inst.id))
                self._moves += 1
                sh = self.shadow[inst.id]
                before = sh.version
                sh.add(req, self.predictor.predict(req))
                self._placed_at[req.id] = now
                if self.kv_exits:
                    self._joined(sh, req, before)
                if sh.free_slots() <= 0:  # full now: out of its tier's list
                    opened = open_in.get(cast(float, self.tier_of[inst.id]))
                    if opened is not None and inst in opened:
                        opened.remove(inst)
                self._recent[inst.id].append((now, req.prompt_len))
                self._recent_tokens[inst.id] += req.prompt_len
                if self.tier_of[inst.id] == tier:
                    self._own[inst.id] += 1
                    self._counted[req.id] = inst.id
            if self._epoch() == epoch:  # nothing placed: the same walk misses until a move
                self._stuck[tier] = _Stuck(epoch, [item[1] for item in waiting], walked_lost,
                                           looked == len(queue))
            # Only the head was looked at: replace it in place rather than copy the whole
            # queue (a copy per call grows with the backlog).
            queue[:looked] = waiting
        self._tiers_seen = self.tier_of.version
        if self.num_queued():  # requests wait for capacity: look again at the next iteration
            decision.wake_at = now + max(view.step_model.decode_a, 1e-3)
        return decision

    def _new_snapshot(self, inst: InstanceView) -> None:
        """The snapshot counts the prompts sent before it as waiting (or run): drop them from
        the recent list."""
        stats = inst.stats
        self._stats_time[inst.id] = stats.time
        self._waiting_tokens[inst.id] = stats.kv_waiting_blocks * stats.block_size
        recent = [(t, n) for t, n in self._recent[inst.id] if t >= stats.time]
        self._recent[inst.id] = recent
        self._recent_tokens[inst.id] = sum(n for _, n in recent)

    def _open(self, open_in: dict[float, list[InstanceView]],
              by_tier: dict[float, list[InstanceView]], tier: float) -> list[InstanceView]:
        """``tier``'s instances with a free slot, found once a call (``open_in``)."""
        opened = open_in.get(tier)
        if opened is None:
            shadow = self.shadow
            opened = open_in[tier] = [i for i in by_tier.get(tier, ())
                                      if shadow[i.id].free_slots() > 0]
        return opened

    def _epoch(self) -> int:
        """Moves so far (both counts only grow: equal sums, nothing moved)."""
        return self._moves + self.tier_of.version

    def _members(self, view: ClusterView, targets: list[InstanceView]
                 ) -> dict[float, list[InstanceView]]:
        """Each tier's instances among ``targets``, in their order (the idle pool left out);
        found again when the tiers or the view's membership moved."""
        of = (self.tier_of.version, view, view.version)
        last = self._by_tier_of
        if last[0] != of[0] or last[1] is not view or last[2] != of[2]:
            by_tier: dict[float, list[InstanceView]] = defaultdict(list)
            for inst in targets:
                tier = self.tier_of[inst.id]
                if tier is not None:
                    by_tier[tier].append(inst)
            self._by_tier, self._by_tier_of = by_tier, of
        return self._by_tier

    def _still_stuck(self, tier: float, queue: list[tuple[float, str, Request]],
                     now: float) -> bool:
        """Whether walking ``tier`` now would miss on the same requests as its last walk:
        nothing moved since (``_epoch``), its queue starts with the same requests (and holds
        no more, if that walk reached its end), and none of them has lost its TTFT since. A
        miss with the TTFT checked stays a miss as time passes (the predicted first token only
        moves later), and one without depends on no time."""
        stuck = self._stuck.get(tier)
        if stuck is None or stuck.epoch != self._epoch():
            return False
        n = len(stuck.ids)
        if (stuck.whole and len(queue) != n) or len(queue) < n:
            return False
        model = self._model
        assert model is not None
        return all(item[1] == rid and ttft_lost(item[2], model, now) == lost
                   for item, rid, lost in zip(queue, stuck.ids, stuck.lost, strict=False))

    def _scale_down(self, ids: Iterable[int]) -> None:
        """Those of ``ids`` that accept work and have nothing in flight go back to the idle
        pool. Only an instance whose shadow lost work since the last call can have become
        idle: one that finished a request, or any, after a snapshot."""
        for iid in ids:
            if iid in self._accepting and self.tier_of.get(iid) is not None \
                    and self.shadow[iid].idle:
                self.tier_of[iid] = None  # back to the idle pool

    def on_instance_removed(self, instance_id: int) -> None:
        self.tier_of.pop(instance_id, None)
        self._exit_cache.pop(instance_id, None)

    def on_finished(self, record: RequestRecord, view: ClusterView) -> None:
        self._moves += 1  # room freed, and the output-length history moved
        iid = record.instance
        if iid is not None:
            self._touched.add(iid)
        # Uncounted where it was counted when placed, not by the instance's tier now: a
        # promoted request whose instance later joins the request's tier was never counted.
        self._placed_at.pop(record.request.id, None)
        counted = self._counted.pop(record.request.id, None)
        if counted is not None:
            self._own[counted] -= 1
        exits = self._exit_cache.get(iid) if iid is not None else None
        before = exits.version if exits is not None else -1
        sh = self.shadow.finished(record, iid, self.predictor)
        if exits is not None and sh is not None and sh.version == before + 1:
            exits.leave(record.request.id)  # the rest keep the progress the snapshot gave them
            exits.fold()
            exits.version = sh.version
