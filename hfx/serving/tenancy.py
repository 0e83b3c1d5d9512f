"""Whose a request is, and whether its tenant may send it now.

- ``tenant_of``: the owner of the request's API key where ``--tenants`` declares keys, else its
  ``x-tenant`` header or the Gateway API Inference Extension's
  ``x-gateway-inference-fairness-id``, else ``default`` (hfx/cluster/tenants.py has the file).
- ``RateLimits``: per tenant, a token bucket of requests (``requests_per_second``, a burst of
  one second's worth) and one of tokens (``tokens_per_minute``: prompt plus ``max_tokens``, a
  burst of one minute's worth), as AIBrix and most API gateways limit. A request over either
  is refused with 429 and ``Retry-After``: the seconds until the bucket holds it again. Checked
  in the process that decides, so that N front processes share one budget.
- ``TenantLabels``: tenants as ``/metrics`` labels, bounded: a client that invents a header
  value per request must not grow the page without end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hfx.cluster.tenants import TenantSpec
from hfx.request import DEFAULT_TENANT
from hfx.serving.protocol import APIError

TENANT_HEADERS = ("x-tenant", "x-gateway-inference-fairness-id")
MAX_TENANT_CHARS = 64
MAX_LABELS = 64  # tenants named on /metrics; the rest count as "other"


def bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def tenant_of(headers: Mapping[str, str], keys: Mapping[str, str]) -> str:
    """The request's tenant (``keys``: API key → tenant); a 400 for a header that is not a
    short printable name."""
    if keys:
        token = bearer(headers)
        if token is not None and token in keys:
            return keys[token]
    for name in TENANT_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        value = value.strip()
        if not value or len(value) > MAX_TENANT_CHARS or not value.isprintable():
            raise APIError(400, f"{name} must be a printable name of 1 to {MAX_TENANT_CHARS} "
                           "characters", param=name)
        return value
    return DEFAULT_TENANT


@dataclass(slots=True)
class _Bucket:
    rate: float  # refilled per second
    capacity: float
    level: float
    at: float

    def wait(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` is in the bucket (0: now); nothing is taken."""
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)


class RateLimits:
    def __init__(self, specs: Mapping[str, TenantSpec]) -> None:
        self.specs = dict(specs)
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self.refused: dict[str, int] = {}  # per tenant, for /metrics

    def admit(self, tenant: str, tokens: int, now: float) -> None:
        """Take one request of ``tokens`` from the tenant's buckets, or raise 429 with
        Retry-After."""
        spec = self.specs.get(tenant)
        if spec is None:
            return
        need: list[tuple[_Bucket, float]] = []
        if spec.requests_per_second is not None:
            rate = spec.requests_per_second
            need.append((self._bucket(tenant, "requests", rate, max(1.0, rate), now), 1.0))
        if spec.tokens_per_minute is not None:
            rate = spec.tokens_per_minute / 60.0
            need.append((self._bucket(tenant, "tokens", rate, spec.tokens_per_minute, now),
                         float(tokens)))
        wait = max((bucket.wait(amount, now) for bucket, amount in need), default=0.0)
        if wait > 0:
            self.refused[tenant] = self.refused.get(tenant, 0) + 1
            if math.isinf(wait):
                raise APIError(429, f"tenant {tenant!r}: the request's {tokens} tokens exceed "
                               f"its limit of {spec.tokens_per_minute:g} per minute",
                               kind="rate_limit_error", code="rate_limit_exceeded")
            raise APIError(429, f"tenant {tenant!r} is over its rate limit; retry in "
                           f"{wait:.1f} s", kind="rate_limit_error",
                           code="rate_limit_exceeded",
                           headers={"Retry-After": str(max(1, math.ceil(wait)))})
        for bucket, amount in need:
            bucket.level -= amount

    def _bucket(self, tenant: str, kind: str, rate: float, capacity: float,
                now: float) -> _Bucket:
        bucket = self._buckets.get((tenant, kind))
        if bucket is None:
            bucket = self._buckets[tenant, kind] = _Bucket(rate, capacity, capacity, now)
        return bucket


class TenantLabels:
    """A tenant's ``/metrics`` label: its name for declared tenants and the first
    ``MAX_LABELS`` others seen, else "other"."""

    def __init__(self, declared: set[str] | frozenset[str] = frozenset()) -> None:
        self._named = {DEFAULT_TENANT, *declared}
        self._budget = MAX_LABELS

    def __call__(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        if self._budget > 0:
            self._budget -= 1
            self._named.add(tenant)
            return tenant
        return "other"
