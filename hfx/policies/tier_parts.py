"""HFX's tier parts (``hfx`` ``parts="auto"``): on a fleet large enough, the fleet cut into one
part per TPOT tier, sized online from the tiers' recent load, with an HFX dispatcher of its
own in each part (PolyServe §4.2's binning and §4.3's tier sizes that move with the load, with
HyperFlexis Algorithm 1 inside each part in place of PolyServe's placement).

Why: an instance that keeps a TPOT of τ runs a step at least every τ and pays Eq. 2's fixed
cost a on each, so a share a/τ of its time is gone (36% at 20 ms, 7% at 100 ms on
Llama-3.1-8B/H200, a ≈ 7.2 ms). HFX's guard keeps the strictest TPOT in flight on an instance,
so with every tier on every instance the whole fleet runs at the strictest pace. Parts pay that
pace only where the strict tiers are (tier_split.py, the same split fixed offline).

- **Tiers**: the requests' TPOT targets; a request without one goes with the loosest. A tier's
  load is the instance-seconds its arrivals cost past the steps' fixed costs (the prefill, and
  the expected output's decode, ``OutputLengthPredictor``), decayed with time constant
  ``WINDOW``; its need is that over 1 − a/τ.
- **Sizes**: one instance each, then each next to the part whose need per instance is largest
  (``bottleneck_split``); contiguous in id order; recomputed every ``PERIOD`` and when the
  fleet or the tiers change, kept unless the new sizes lighten the bottleneck by
  ``HYSTERESIS``. A resized part hands its edge instance to its neighbour: what runs there
  finishes there, and the new owner's dispatcher sees it in the instance's snapshot.
- **On** only where every tier gets ``PART_MIN`` instances or more (at 4 instances, one a tier,
  the fixed split carried 0.76-0.83x least-loaded: a part too small to absorb its tier's
  bursts; docs/results.md) and the parts' bottleneck is ``MIN_GAIN`` (10%) lighter than the
  whole fleet at the strictest pace (PolyServe's tiers on 20 instances: 19%; two-task's 0.2
  and 0.5 s, 4%; four-task's 0.5-1 s, under 1%: off). Off, the host
  dispatcher serves the whole fleet as it did without parts, decision for decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from hfx.policies.base import ClusterView, Decision, InstanceView
from hfx.policies.output_length import OutputLengthPredictor
from hfx.request import Outcome, Request, RequestRecord
from hfx.stepmodel.step_time import StepTimeModel

if TYPE_CHECKING:
    from hfx.policies.hfx import HFXDispatcher

PART_MIN = 3  # instances a tier's part needs at least (above)
# How much lighter the parts' bottleneck must be than the whole fleet's to start them (half
# that to stop): the count leaves out what smaller pools lose in multiplexing, and two-task
# at 16 instances, counted 4-7% lighter, lost 22% of its capacity with parts (set on that
# evaluated cell; docs/results.md, "HFX's defaults").
MIN_GAIN = 0.10
WINDOW = 60.0  # seconds: the time constant of a tier's load (PolyServe §4.3 moves tiers online)
PERIOD = 10.0  # seconds between sizings
HYSTERESIS = 0.05  # how much a resize must lighten the bottleneck to move instances
NO_SLO = math.inf  # the tier of a request without a TPOT: sorts loosest
MAX_PENDING = 4096  # arrivals noted before a fleet too small for parts prices them


class Change(Enum):
    KEPT = "kept"
    STARTED = "started"
    STOPPED = "stopped"


def demand(loads: list[float], tpots: list[float], fixed: float) -> list[float]:
    """Each tier's load over the share of an instance's time its pace leaves, 1 − a/τ (a:
    Eq. 2's fixed step cost): how much fleet each tier needs, relatively."""
    return [w / max(1e-9, 1.0 - fixed / t) for w, t in zip(loads, tpots, strict=True)]


def bottleneck_split(need: list[float], total: int) -> list[int]:
    """``total`` instances over the tiers so that the most loaded part (need per instance)
    is as light as it can be: one each, then each next one to the part loaded most, the
    stricter on a tie (Jefferson's method, which minimises the largest ratio). A part short
    of an instance loses its tier while the others idle: the bottleneck decides, not the sum,
    which is what a largest-remainder split (tier_split.py) balances."""
    sizes = [1] * len(need)
    for _ in range(total - len(need)):
        i = max(range(len(need)), key=lambda j: (need[j] / sizes[j], -j))
        sizes[i] += 1
    return sizes


def peak(need: list[float], sizes: list[int]) -> float:
    """The bottleneck: the largest need per instance of any part."""
    return max(n / s for n, s in zip(need, sizes, strict=True))


def tier_of(req: Request) -> float:
    return req.slo.tpot if req.slo is not None and req.slo.tpot else NO_SLO


class _Part:
    """One tier's dispatcher and the view of its instances it is given."""

    __slots__ = ("dispatcher", "ids", "members", "parent_version", "view")

    def __init__(self, dispatcher: HFXDispatcher) -> None:
        self.dispatcher = dispatcher
        self.view: ClusterView | None = None
        self.members: list[InstanceView] | None = None
        self.ids: tuple[int, ...] = ()
        self.parent_version = -1

    def view_of(self, parent: ClusterView, members: list[InstanceView]) -> ClusterView:
        """The parent view cut to ``members``; its version moves when the parent's does or
        the members change (the dispatcher's shadows follow it)."""
        # The members list is made anew only when the fleet or the split changes: read its
        # ids then, not on every call.
        ids = self.ids if members is self.members else tuple(i.id for i in members)
        self.members = members
        v = self.view
        if v is None:
            v = self.view = ClusterView(parent.now, members, parent.step_model, parent.profile,
                                        parent.mixed_steps, 0, parent.prefix,
                                        parent.step_tokens)
        elif ids != self.ids or parent.version != self.parent_version:
            v.instances = members
            v.changed()
        v.now, v.step_model, v.profile = parent.now, parent.step_model, parent.profile
        v.mixed_steps, v.step_tokens, v.prefix = (parent.mixed_steps, parent.step_tokens,
                                                  parent.prefix)
        v.fair_shares, v.fair_past = parent.fair_shares, parent.fair_past
        v.fair_running, v.fair_reserve = parent.fair_running, parent.fair_reserve
        self.ids, self.parent_version = ids, parent.version
        return v


class TierParts:
    """The parts of a host HFX dispatcher: tiers' load, sizes, and each part's dispatcher
    (made by ``spawn``) with the requests queued in it."""

    def __init__(self, spawn: Callable[[], HFXDispatcher]) -> None:
        self.spawn = spawn
        self.parts: dict[float, _Part] = {}  # tier → its part; empty: off
        self.split: dict[int, float] = {}  # instance id → the tier whose part holds it
        self.predictor = OutputLengthPredictor()
        self.load: dict[float, float] = {}  # tier → decayed work (instance-seconds)
        self._load_at = 0.0
        self._pending: list[tuple[float, Request, float]] = []  # arrivals not yet priced
        self._tiers: tuple[float, ...] = ()  # the tiers with load, as of the last pricing
        self._queued: dict[str, tuple[Request, float]] = {}  # id → (request, its part's tier)
        self._sized_at = -math.inf
        self._sized_for: tuple[tuple[int, ...], tuple[float, ...]] = ((), ())
        self._sizes: list[int] = []
        self._ids: tuple[int, ...] = ()
        self._kept_for: tuple[tuple[float, ...], int] = ((), 0)
        self._targets: list[InstanceView] | None = None
        self._target_ids: tuple[int, ...] = ()
        # Each part's members, for the accepting list and split they were cut from.
        self._members: dict[float, list[InstanceView]] = {}
        self._members_for: tuple[list[InstanceView] | None, dict[int, float] | None] = (None,
                                                                                      None)

    @property
    def active(self) -> bool:
        return bool(self.parts)

    # ---- requests ---------------------------------------------------------------------
    def note(self, request: Request, now: float) -> None:
        """An arrival, for its tier's load (priced at the next sizing, which has the model)."""
        self._pending.append((now, request, self.predictor.predict(request)))

    def route(self, request: Request, now: float) -> None:
        """Queue ``request`` in its part."""
        key = self._part_of(tier_of(request))
        self._queued[request.id] = (request, key)
        self.parts[key].dispatcher.enqueue(request, now)

    def _part_of(self, tier: float) -> float:
        """The part of the loosest tier at or below ``tier`` (its pace keeps ``tier``), the
        strictest if none is."""
        below = [t for t in self.parts if t <= tier]
        return max(below) if below else min(self.parts)

    def num_queued(self) -> int:
        return len(self._queued)

    def withdraw(self, request_id: str) -> bool:
        entry = self._queued.pop(request_id, None)
        return entry is not None and self.parts[entry[1]].dispatcher.withdraw(request_id)

    def drain(self) -> list[Request]:
        """Turn the parts off: the requests queued in them, in arrival order, for the host."""
        out = []
        for rid, (req, key) in self._queued.items():
            self.parts[key].dispatcher.withdraw(rid)
            out.append(req)
        self._queued.clear()
        self.parts, self.split, self._sizes, self._ids = {}, {}, [], ()
        return out

    # ---- sizing -----------------------------------------------------------------------
    def ids_of(self, targets: list[InstanceView]) -> tuple[int, ...]:
        """The accepting instances' ids in order; sorted again only when the list changes
        (``ClusterView.accepting`` gives one list per version): at 1,000 instances a sort
        per call would be the dispatcher's cost."""
        if targets is not self._targets:
            self._targets, self._target_ids = targets, tuple(sorted(i.id for i in targets))
        return self._target_ids

    def _price(self, model: StepTimeModel) -> None:
        for at, req, out in self._pending:
            if at > self._load_at:
                decay = math.exp(-(at - self._load_at) / WINDOW)
                for t in self.load:
                    self.load[t] *= decay
                self._load_at = at
            p = req.prompt_len
            work = (model.prefill_one(p) - model.prefill_a
                    + out * (model.decode_b * (p + out / 2) + model.decode_c))
            t = tier_of(req)
            self.load[t] = self.load.get(t, 0.0) + work
        self._pending.clear()
        # The loads change only here: the tiers that count are read once per pricing.
        total = sum(self.load.values())
        self._tiers = tuple(sorted(t for t, w in self.load.items() if w > 1e-3 * total))

    def update(self, ids: tuple[int, ...], model: StepTimeModel, now: float) -> Change:
        """Size the parts anew if due (``ids``: the accepting instances, in order). STARTED:
        the host moves its queue into the parts (``route``); STOPPED: it takes theirs back
        (``drain``)."""
        if not self.parts and len(ids) < 2 * PART_MIN:
            # No split of so few instances can start (``_sizing``): price later, in one go
            # (the same sums in the same order), but keep the list short on a long run.
            if len(self._pending) >= MAX_PENDING:
                self._price(model)
            self._sized_for = ((), ())  # a fleet grown back is sized at once, as a new one
            return Change.KEPT
        if self._pending:
            self._price(model)
        tiers = self._tiers
        if now - self._sized_at < PERIOD and (ids, tiers) == self._sized_for:
            return Change.KEPT
        self._sized_at, self._sized_for = now, (ids, tiers)
        sizes = self._sizing(ids, tiers, model.decode_a)
        if sizes is None:
            return Change.STOPPED if self.parts else Change.KEPT
        started = not self.parts
        if started or sizes != self._sizes or tuple(self.parts) != tiers \
                or self._ids != ids:
            self._resize(ids, tiers, sizes, now)
        return Change.STARTED if started else Change.KEPT

    def _sizing(self, ids: tuple[int, ...], tiers: tuple[float, ...],
                fixed: float) -> list[int] | None:
        """Instances per tier, or None where the parts should be off."""
        if len(tiers) < 2 or len(ids) < PART_MIN * len(tiers):
            return None
        # A request without a TPOT keeps any pace: its part is sized as twice the loosest.
        loosest = max((t for t in tiers if t < NO_SLO), default=1.0)
        tpots = [t if t < NO_SLO else 2 * loosest for t in tiers]
        loads = [self.load[t] for t in tiers]
        need = demand(loads, tpots, fixed)
        sizes = bottleneck_split(need, len(ids))
        if self.parts and (tiers, len(ids)) == self._kept_for and (
                peak(need, sizes) > (1.0 - HYSTERESIS) * peak(need, self._sizes)):
            sizes = self._sizes  # not worth moving instances for
        whole = demand([sum(loads)], [min(tpots)], fixed)[0] / len(ids)
        gain = whole / peak(need, sizes) - 1.0
        if gain < (MIN_GAIN / 2 if self.parts else MIN_GAIN):  # less to stay on: no flapping
            return None
        self._kept_for = (tiers, len(ids))
        return sizes

    def _resize(self, ids: tuple[int, ...], tiers: tuple[float, ...], sizes: list[int],
                now: float) -> None:
        """The parts as ``sizes`` says (``ids`` in order); queued requests follow their tier
        to its part's dispatcher."""
        old = self.parts
        self.parts = {t: old.get(t) or _Part(self.spawn()) for t in tiers}
        self._sizes, self._ids = sizes, ids
        self.split = {}
        start = 0
        for t, size in zip(tiers, sizes, strict=True):
            for iid in ids[start:start + size]:
                self.split[iid] = t
            start += size
        for rid, (req, key) in list(self._queued.items()):
            new = self._part_of(tier_of(req))
            if new != key:
                old[key].dispatcher.withdraw(rid)
                self._queued[rid] = (req, new)
                self.parts[new].dispatcher.enqueue(req, now)

    # ---- dispatch ---------------------------------------------------------------------
    def schedule(self, view: ClusterView, targets: list[InstanceView]) -> Decision:
        """Each part's dispatcher over its instances; one decision, the earliest wake-up."""
        if self._members_for[0] is not targets or self._members_for[1] is not self.split:
            self._members = {t: [] for t in self.parts}
            for inst in targets:
                self._members[self.split[inst.id]].append(inst)
            self._members_for = (targets, self.split)
        members = self._members
        decision = Decision()
        for t, part in self.parts.items():
            sub = part.dispatcher.schedule(part.view_of(view, members[t]))
            decision.dispatch.extend(sub.dispatch)
            decision.reject.extend(sub.reject)
            if sub.wake_at is not None and (decision.wake_at is None
                                            or sub.wake_at < decision.wake_at):
                decision.wake_at = sub.wake_at
        for d in decision.dispatch:
            self._queued.pop(d.request.id, None)
        for r in decision.reject:
            self._queued.pop(r.id, None)
        return decision

    def observe(self, record: RequestRecord) -> None:
        if record.outcome is Outcome.FINISHED:
            self.predictor.observe(record.request.task, record.num_tokens)

    def holder(self, instance: int | None) -> HFXDispatcher | None:
        """The dispatcher of the part that holds ``instance`` now (None: no part does)."""
        key = self.split.get(instance) if instance is not None else None
        return None if key is None else self.parts[key].dispatcher

    def removed(self, instance_id: int) -> None:
        for part in self.parts.values():
            part.dispatcher.on_instance_removed(instance_id)
