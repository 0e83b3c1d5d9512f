"""Outlier ejection: an instance whose streams keep breaking stops getting new requests for a
while; faults alone never empty the fleet.

The rule is a load balancer's (Envoy's outlier detection, its ``consecutive_5xx`` detector,
read in its docs, ``config.cluster.v3.OutlierDetection``):

- ``consecutive`` broken streams in a row on one instance (Envoy's default: 5) eject it: no new
  request goes there, and the streams it runs go on. A whole stream resets the count.
- The ejection lasts ``base_seconds`` times the number of times it was ejected (Envoy: 30 s),
  at most ``max_seconds`` (Envoy: 300 s). The multiplier falls by one for each ``base_seconds``
  the instance then serves without an ejection, as Envoy's does per quiet interval.
- At most ``max_share`` of a pool is ejected at once (Envoy's ``max_ejection_percent``, 10%),
  but one instance always may be (Envoy's ``always_eject_one_host``), and never the last one
  accepting work: a burst of bad requests (one buggy client, one bad prompt template) breaks
  streams on every server, and ejecting them all would fail every healthy user.
- When the ejection ends, the instance's health check decides (where it has one): answered,
  it is re-admitted; not, the ejection goes on for another ``base_seconds``. A failed health
  check right after a fault takes an instance out at once: that is the instance's own rule
  (a server that is gone), not this one.

The detector only decides; the control plane acts (``Fleet.eject``, ``Fleet.readmit``) on the
loop's clock.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    """When faults eject an instance, and for how long (defaults: Envoy's)."""

    consecutive: int = 5  # broken streams in a row; 0: never eject
    base_seconds: float = 30.0
    max_seconds: float = 300.0
    max_share: float = 0.1  # of a pool's instances ejected at once (one always may be)

    def __post_init__(self) -> None:
        if self.consecutive < 0:
            raise ValueError(f"consecutive must be >= 0, got {self.consecutive}")
        if not 0 < self.base_seconds <= self.max_seconds:
            raise ValueError(f"need 0 < base_seconds ({self.base_seconds:g}) <= max_seconds "
                             f"({self.max_seconds:g})")
        if not 0 <= self.max_share <= 1:
            raise ValueError(f"max_share must be in [0, 1], got {self.max_share:g}")

    def allowed(self, pool: int) -> int:
        """Instances of a pool of ``pool`` that may be ejected at once."""
        return max(1, math.floor(self.max_share * pool)) if pool > 1 else 0


@dataclass(slots=True)
class _Host:
    in_a_row: int = 0
    ejections: int = 0  # the multiplier of the next ejection's length, less one
    since: float = 0.0  # when it was last re-admitted (the multiplier's decay counts from it)
    until: float | None = None  # the end of its ejection, while ejected


@dataclass(slots=True)
class OutlierDetector:
    policy: EjectionPolicy = field(default_factory=EjectionPolicy)
    _hosts: dict[int, _Host] = field(default_factory=dict)
    # For operators: ejections, re-admissions, ejections the share bound refused, by instance.
    ejected: Counter[int] = field(default_factory=Counter)
    readmitted: Counter[int] = field(default_factory=Counter)
    spared: Counter[int] = field(default_factory=Counter)

    def is_ejected(self, instance_id: int) -> bool:
        host = self._hosts.get(instance_id)
        return host is not None and host.until is not None

    def ejected_now(self) -> list[int]:
        return sorted(i for i, h in self._hosts.items() if h.until is not None)

    def success(self, instance_id: int) -> None:
        """A stream on the instance ended whole."""
        host = self._hosts.get(instance_id)
        if host is not None:
            host.in_a_row = 0

    def fault(self, instance_id: int, now: float, pool: list[int], accepting: list[int]
              ) -> float | None:
        """A stream on the instance broke. ``pool``: the instances of its role that serve (not
        draining), ``accepting``: those taking new work. Returns when its ejection ends if it
        is to be ejected now, else None."""
        host = self._hosts.setdefault(instance_id, _Host(since=now))
        host.in_a_row += 1
        rule = self.policy
        if not rule.consecutive or host.in_a_row < rule.consecutive or host.until is not None:
            return None
        others = [i for i in accepting if i != instance_id]
        out = sum(1 for i in pool if self.is_ejected(i))
        if not others or out >= rule.allowed(len(pool)):
            self.spared[instance_id] += 1
            return None
        quiet = int((now - host.since) // rule.base_seconds)
        host.ejections = max(0, host.ejections - quiet) + 1
        host.until = now + min(rule.base_seconds * host.ejections, rule.max_seconds)
        host.in_a_row = 0
        self.ejected[instance_id] += 1
        return host.until

    def extend(self, instance_id: int, now: float) -> float:
        """Its health check failed as the ejection ended: another ``base_seconds``."""
        host = self._hosts[instance_id]
        host.until = now + self.policy.base_seconds
        return host.until

    def readmit(self, instance_id: int, now: float) -> bool:
        """The ejection is over (or cut short); False if it was not ejected."""
        host = self._hosts.get(instance_id)
        if host is None or host.until is None:
            return False
        host.until, host.since, host.in_a_row = None, now, 0
        self.readmitted[instance_id] += 1
        return True

    def forget(self, instance_id: int) -> None:
        """The instance left the fleet."""
        self._hosts.pop(instance_id, None)

