"""Admission control: the one rule that sheds load, for ``hfx sim`` and ``hfx serve`` alike.

A fleet past its capacity must say no rather than queue without bound: HFX keeps a
request whose TTFT is already lost in a best-effort tier (HyperFlexis §5.1 leaves its fate open),
and under sustained overload that tier only grows. Two bounds, each off unless set:

- ``max_queued``: requests waiting at the dispatcher. An arrival beyond it is shed at once
  (the gateway answers 429 with Retry-After).
- ``max_wait``: seconds a request may go past its TTFT SLO without a first token, wherever it
  waits — in the dispatcher's queue or inside an instance's. Then it is shed (503 with
  Retry-After, or an error event on a stream already open).

A request whose prefill is under way when its wait bound passes is aborted at the end of that
step, and may see its first token first. A shed request ends with outcome ``shed``: a miss in
attainment, counted apart from rejections (a policy's choice) and failures (an error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hfx.request import RequestRecord


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_queued: int | None = None
    max_wait: float | None = None  # seconds past the TTFT SLO

    def __post_init__(self) -> None:
        if self.max_queued is not None and self.max_queued < 1:
            raise ValueError(f"max_queued must be >= 1, got {self.max_queued}")
        if self.max_wait is not None and not 0 <= self.max_wait < math.inf:
            raise ValueError(f"max_wait must be finite and >= 0, got {self.max_wait}")

    def queue_full(self, queued: int) -> str | None:
        """Why an arrival finding ``queued`` requests at the dispatcher is shed; None: admit."""
        if self.max_queued is not None and queued >= self.max_queued:
            return f"the dispatch queue is full ({queued} requests waiting)"
        return None

    def first_token_deadline(self, record: RequestRecord) -> float | None:
        """When ``record`` is shed if it has no first token by then; None: never."""
        if self.max_wait is None:
            return None
        assert record.slo is not None
        return record.request.arrival + record.slo.ttft + self.max_wait

    def late(self) -> str:
        return f"no first token {self.max_wait:g} s past the TTFT SLO"
