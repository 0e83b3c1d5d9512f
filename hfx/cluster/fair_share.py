"""Fair shares between tenants: who goes next to the dispatcher when the fleet is saturated.

A tenant (an API key's owner, or the ``x-tenant`` header) that floods the gateway must not
take the others' capacity. The rule is the virtual token counter of "Fairness in Serving Large
Language Models" (Sheng et al., OSDI 2024, §4, Algorithm 2), in the place the Gateway API
Inference Extension's flow control puts it: in front of the dispatcher, acting only while the
fleet is saturated.

- Each tenant has a counter of the service it received: ``input_weight`` per prompt token and
  ``output_weight`` per output token (VTC's w_p = 1, w_q = 2: an output token costs a decode
  step), divided by the tenant's weight. A request is charged its prompt and its ``max_tokens``
  when it goes to the dispatcher; at its end the charge is corrected to the tokens it really
  produced.
- While the fleet is not saturated every request passes at once (its charge counted): fairness
  costs nothing when there is room for everyone.
- Saturated (the ``gate`` says so: the dispatcher holds requests it cannot place, or every
  instance has a queue of its own), arrivals wait here, one FIFO per tenant within each
  priority band. As room frees, the next request comes from the highest band, and within it
  from the backlogged tenant with the smallest counter (VTC's selection).
- A tenant that becomes backlogged has its counter lifted to the smallest counter of the
  tenants with work outstanding (VTC's lift), so that time away banks no credit.

Dynamo's router (deficit round robin, weighted by uncached tokens) would serve the same end;
VTC was chosen for its bound: two backlogged tenants' service differs by at most a constant
(the paper's Theorem 4.4), whatever their request sizes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from hfx.request import Request

INPUT_WEIGHT, OUTPUT_WEIGHT = 1.0, 2.0  # VTC's w_p and w_q (Sheng et al. §4)


@dataclass(slots=True)
class _Band:
    """One priority band's waiting requests, per tenant, in arrival order."""

    queues: dict[str, deque[Request]] = field(default_factory=dict)


class FairShare:
    """The tenants' counters and the requests held while the fleet is saturated."""

    def __init__(self, weights: Mapping[str, float] | None = None,
                 input_weight: float = INPUT_WEIGHT, output_weight: float = OUTPUT_WEIGHT
                 ) -> None:
        self.weights = dict(weights or {})
        for tenant, w in self.weights.items():
            if not w > 0:
                raise ValueError(f"tenant {tenant!r}: weight must be > 0, got {w}")
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.counters: dict[str, float] = {}  # virtual service received, per tenant
        self.outstanding: dict[str, int] = {}  # requests passed and not ended, per tenant
        self._bands: dict[int, _Band] = {}
        self._where: dict[str, tuple[int, str]] = {}  # held request id → (band, tenant)
        self._charged: dict[str, tuple[str, int]] = {}  # passed id → (tenant, max_tokens)

    # ---- what callers read -------------------------------------------------------------------
    @property
    def num_held(self) -> int:
        return len(self._where)

    def held_by(self) -> dict[str, int]:
        """Requests held now, per tenant (for /metrics)."""
        out: dict[str, int] = {}
        for _, tenant in self._where.values():
            out[tenant] = out.get(tenant, 0) + 1
        return out

    # ---- the path of a request ---------------------------------------------------------------
    def arrive(self, request: Request, saturated: bool) -> bool:
        """A new request: True if it goes to the dispatcher now (charged), False if it is held
        (the fleet is saturated, or others of its band wait already: no overtaking)."""
        band = _band_of(request)
        if not saturated and not self._bands:
            self._charge(request)
            return True
        tenant = request.tenant
        queues = self._bands.setdefault(band, _Band()).queues
        if tenant not in queues:
            self._lift(tenant)
            queues[tenant] = deque()
        queues[tenant].append(request)
        self._where[request.id] = (band, tenant)
        return False

    def release(self, saturated: Callable[[], bool]) -> Iterator[Request]:
        """Held requests in fair order while ``saturated()`` says there is room; each is
        charged as it goes. The caller hands each to the dispatcher before asking for the
        next (that is what fills the room)."""
        while self._bands and not saturated():
            band = min(self._bands)
            queues = self._bands[band].queues
            tenant = min(queues, key=lambda t: (self.counters.get(t, 0.0), t))
            queue = queues[tenant]
            request = queue.popleft()
            if not queue:
                del queues[tenant]
                if not queues:
                    del self._bands[band]
            del self._where[request.id]
            self._charge(request)
            yield request

    def withdraw(self, request_id: str) -> bool:
        """A held request ends before its turn (aborted, shed); False if it is not held."""
        where = self._where.pop(request_id, None)
        if where is None:
            return False
        band, tenant = where
        queues = self._bands[band].queues
        queue = queues[tenant]
        for i, r in enumerate(queue):
            if r.id == request_id:
                del queue[i]
                break
        if not queue:
            del queues[tenant]
            if not queues:
                del self._bands[band]
        return True

    def finished(self, request_id: str, tokens: int) -> None:
        """A request that passed ended with ``tokens`` output tokens: its charge is corrected
        from ``max_tokens`` to them."""
        charged = self._charged.pop(request_id, None)
        if charged is None:
            return
        tenant, max_tokens = charged
        self.counters[tenant] += self.output_weight * (tokens - max_tokens) / self._weight(tenant)
        n = self.outstanding[tenant] - 1
        if n:
            self.outstanding[tenant] = n
        else:
            del self.outstanding[tenant]

    # ---- counters ----------------------------------------------------------------------------
    def _weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def _charge(self, request: Request) -> None:
        tenant = request.tenant
        if tenant not in self.outstanding and not self._backlogged(tenant):
            self._lift(tenant)
        cost = (self.input_weight * request.prompt_len
                + self.output_weight * request.max_tokens) / self._weight(tenant)
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost
        self.outstanding[tenant] = self.outstanding.get(tenant, 0) + 1
        self._charged[request.id] = (tenant, request.max_tokens)

    def _backlogged(self, tenant: str) -> bool:
        return any(tenant in b.queues for b in self._bands.values())

    def _lift(self, tenant: str) -> None:
        """VTC's lift: a tenant that comes back starts at the smallest counter of those with
        work outstanding or waiting, never below its own."""
        active = {*self.outstanding, *(t for b in self._bands.values() for t in b.queues)}
        active.discard(tenant)
        if active:
            floor = min(self.counters.get(t, 0.0) for t in active)
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)


def _band_of(request: Request) -> int:
    """The priority band: the request's priority (0 first), else one band for all."""
    return request.priority if request.priority is not None else 0
