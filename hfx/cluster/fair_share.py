"""Fair shares between tenants: which tenant's request is served next when the fleet cannot
serve them all.

A tenant (an API key's owner, or the ``x-tenant`` header) that floods the gateway must not take
the others' capacity. Each request gets a start tag by start-time fair queueing (Goyal, Vin and
Cheng, "Start-time Fair Queueing", SIGCOMM 1996), with the cost of "Fairness in Serving Large
Language Models" (Sheng et al., OSDI 2024, §4: ``input_weight`` per prompt token and
``output_weight`` per output token, w_p = 1, w_q = 2):

- S(r) = max(V, F(tenant)), F(tenant) = S(r) + cost(r) / weight(tenant); V, the virtual time,
  is the largest start tag dispatched so far. A tenant back from idle starts at V: time away
  banks no credit (VTC's lift). A request is charged its ``max_tokens``; at its end the tenant's
  F is corrected to the tokens it really produced.
- Where a dispatcher keeps a queue, it serves each SLO class in start-tag order instead of
  arrival order (HFX's Q_R: ``SLOQueue``): a flooding tenant's tags run ahead of V, so a calm
  tenant's request goes before the flood's backlog in its class, while the flood still gets
  every bit of capacity nobody else asks for. With one tenant, tags rise with arrivals: arrival
  order, as without fair shares.
- Where it keeps none (it places each request on arrival: round robin, least-loaded), requests
  wait here instead while every instance has a queue of its own (the Gateway API Inference
  Extension's saturation detector) and two tenants or more have requests open, and go in
  start-tag order as room frees, the highest priority band first. One tenant alone is never
  held: there is no share to keep.

- Ordering a queue does not start anything sooner while every sequence an instance runs is
  taken: a calm tenant's request then waits for a flood's batch to end (on one 16-sequence
  instance its median TTFT was 11x its TTFT alone: docs/results.md, "Faults and floods").
  So a tenant running its weighted share of the fleet's sequences or more, while another
  tenant is active (requests open, or one arrived within ``LINGER``), may not take an
  instance's last ``reserve`` free sequences: they are kept for the others. Preempting a
  flood's request would serve the same end, but vLLM's scheduler preempts only when KV runs
  short (v1/core/sched/scheduler.py), and HFX reaches its engines only through requests; a
  kept sequence preempts nobody, at the cost of at most ``reserve`` idle sequences per
  instance while a flood saturates it.

Dynamo's router (deficit round robin, weighted by uncached tokens) would serve the same end;
start tags were chosen because they order a dispatcher's existing queue without holding
anything back from it: HFX's admission needs the whole queue to find requests that can still
make their SLO (held back behind a gate, it served its best-effort tier instead and lost two
thirds of its goodput under a flood: docs/log/2026-11-28-faults-and-floods.md). Measured:
docs/results.md "Faults and floods".
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping

from hfx.request import Request

INPUT_WEIGHT, OUTPUT_WEIGHT = 1.0, 2.0  # VTC's w_p and w_q (Sheng et al. §4)
# Scope "fleet": how far a tenant's charged service may run past the least-served open
# tenant's and still count as within its share, about a hundred requests of four-task's mix
# at VTC's weights.
WINDOW = 65536.0
SCOPES = ("class", "fleet")
# Sequences per instance kept for tenants within their share of the fleet's: one starts a
# calm tenant's request at the instance's next step.
RESERVE = 1
# How long a tenant's last arrival keeps its claim on kept sequences: one whose requests come
# seconds apart (a chat's turns, a client's polling) finds one free at its next.
LINGER = 10.0


class FairShare:
    """The tenants' tags, and the requests held while a queueless dispatcher is saturated."""

    def __init__(self, weights: Mapping[str, float] | None = None, scope: str = "class",
                 input_weight: float = INPUT_WEIGHT, output_weight: float = OUTPUT_WEIGHT,
                 reserve: int = RESERVE) -> None:
        if scope not in SCOPES:
            raise ValueError(f"unknown fair-share scope {scope!r}; choose one of "
                             f"{', '.join(SCOPES)}")
        self.scope = scope
        self.weights = dict(weights or {})
        for tenant, w in self.weights.items():
            if not w > 0:
                raise ValueError(f"tenant {tenant!r}: weight must be > 0, got {w}")
        if reserve < 0:
            raise ValueError(f"fair-share reserve must be >= 0, got {reserve}")
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.reserve = reserve
        self.virtual = 0.0  # V, the frontier (``frontier``); never moves back
        self.finish: dict[str, float] = {}  # F per tenant: the service charged to it
        self._charged: dict[str, tuple[str, int]] = {}  # request id → (tenant, max_tokens)
        self._open: dict[str, int] = {}  # tenant → its requests tagged and not ended
        self._running: dict[str, int] = {}  # tenant → its requests placed and not ended
        self._running_ids: set[str] = set()
        self._seen: dict[str, float] = {}  # tenant → its last arrival
        # (tag, TTFT deadline, id) of the requests waiting for a placement, lazily pruned.
        self._waiting: list[tuple[float, float, str]] = []
        self._placed: set[str] = set()
        # Held: (band, tag, arrival order, request); ids held, for withdraw.
        self._held: list[tuple[int, float, int, Request]] = []
        self._held_ids: set[str] = set()
        self._order = 0

    # ---- tags ----------------------------------------------------------------------------
    def tag(self, request: Request, now: float) -> float:
        """Give an arriving request its start tag (``request.fair_tag``) and charge it."""
        tenant = request.tenant
        start = max(self.frontier(now), self.finish.get(tenant, 0.0))
        cost = self.input_weight * request.prompt_len + self.output_weight * request.max_tokens
        self.finish[tenant] = start + cost / self.weights.get(tenant, 1.0)
        self._charged[request.id] = (tenant, request.max_tokens)
        self._open[tenant] = self._open.get(tenant, 0) + 1
        self._seen[tenant] = now
        request.fair_tag = start
        slo = request.slo
        deadline = request.arrival + slo.ttft if slo is not None else float("inf")
        heapq.heappush(self._waiting, (start, deadline, request.id))
        return start

    def contended(self) -> bool:
        """Two tenants or more have requests open: only then is there a share to keep (one
        tenant alone is never held back)."""
        return len(self._open) > 1

    def dispatched(self, request: Request) -> None:
        """It was placed: it no longer holds the frontier back."""
        rid = request.id
        if rid in self._charged:
            self._placed.add(rid)
            if rid not in self._running_ids:  # a request resumed elsewhere counts once
                self._running_ids.add(rid)
                self._running[request.tenant] = self._running.get(request.tenant, 0) + 1

    def finished(self, request_id: str, tokens: int) -> None:
        """It ended with ``tokens`` output tokens: its tenant's charge is corrected from
        ``max_tokens`` to them."""
        charged = self._charged.pop(request_id, None)
        self._placed.discard(request_id)
        if charged is None:
            return
        tenant, max_tokens = charged
        _count_down(self._open, tenant)
        if request_id in self._running_ids:
            self._running_ids.discard(request_id)
            _count_down(self._running, tenant)
        self.finish[tenant] -= (self.output_weight * (max_tokens - tokens)
                                / self.weights.get(tenant, 1.0))

    @property
    def running(self) -> Mapping[str, int]:
        """Requests placed and not ended, per tenant (live)."""
        return self._running

    def shares(self, slots: int, now: float) -> dict[str, float]:
        """Each active tenant's weighted share of ``slots`` (the fleet's sequences): a tenant
        running its share or more may not take an instance's last ``reserve`` free
        sequences. Active: requests open, or one arrived within ``LINGER``. Empty while one
        tenant alone is active (there is no share to keep) or nothing is kept."""
        if not self.reserve:
            return {}
        seen, open_ = self._seen, self._open
        for tenant in [t for t, at in seen.items() if now - at >= LINGER and t not in open_]:
            del seen[tenant]
        if len(seen) < 2:
            return {}
        weights = self.weights
        per = slots / sum(weights.get(t, 1.0) for t in seen)
        return {t: per * weights.get(t, 1.0) for t in seen}

    def past_share(self) -> frozenset[str]:
        """Tenants whose charged service runs more than ``WINDOW`` past the least-served
        tenant with requests open: each of their requests waits behind the others'. Empty
        while fewer than two tenants have requests open."""
        open_ = self._open
        if len(open_) < 2:
            return frozenset()
        finish = self.finish
        least = min(finish.get(t, 0.0) for t in open_)
        return frozenset(t for t in open_ if finish.get(t, 0.0) > least + WINDOW)

    def frontier(self, now: float) -> float:
        """V: the least start tag of a request still waiting for its placement with its TTFT
        ahead. With several instances serving out of tag order this stands for SFQ's "tag of
        the request in service"; a request the dispatcher leaves behind (its TTFT lost: HFX's
        best-effort tier) does not hold it back. It never moves back; with nothing waiting
        it stays where it was."""
        waiting = self._waiting
        while waiting:
            tag, deadline, rid = waiting[0]
            if rid in self._charged and rid not in self._placed and deadline > now:
                if tag > self.virtual:
                    self.virtual = tag
                break
            heapq.heappop(waiting)
            self._placed.discard(rid)
        return self.virtual

    # ---- holding, for dispatchers without a queue ----------------------------------------
    @property
    def num_held(self) -> int:
        return len(self._held_ids)

    def held_by(self) -> dict[str, int]:
        """Requests held now, per tenant (for /metrics)."""
        out: dict[str, int] = {}
        for _, _, _, r in self._held:
            if r.id in self._held_ids:
                out[r.tenant] = out.get(r.tenant, 0) + 1
        return out

    def hold(self, request: Request) -> None:
        """Keep a tagged request until ``release`` finds room for it."""
        assert request.fair_tag is not None, "tag() it first"
        self._order += 1
        heapq.heappush(self._held, (_band_of(request), request.fair_tag, self._order, request))
        self._held_ids.add(request.id)

    def release(self, saturated: Callable[[], bool]) -> Iterator[Request]:
        """Held requests, highest band first and by start tag within it, until
        ``saturated()`` says there is no room. The caller hands each to the dispatcher before
        asking for the next (that is what fills the room)."""
        held = self._held
        while held and not saturated():
            request = heapq.heappop(held)[3]
            if request.id in self._held_ids:
                self._held_ids.discard(request.id)
                yield request

    def withdraw(self, request_id: str) -> bool:
        """A held request ends before its turn (aborted, shed); False if it is not held."""
        if request_id not in self._held_ids:
            return False
        self._held_ids.discard(request_id)  # its heap entry is skipped when it surfaces
        return True


def _count_down(counts: dict[str, int], tenant: str) -> None:
    n = counts[tenant] - 1
    if n:
        counts[tenant] = n
    else:
        del counts[tenant]


def _band_of(request: Request) -> int:
    """The priority band: the request's priority (0 first), else one band for all."""
    return request.priority if request.priority is not None else 0
