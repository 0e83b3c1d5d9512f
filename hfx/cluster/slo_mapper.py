"""Priority-based SLO mapping, HFX-PM (HyperFlexis §5.2, Algorithm 2, Eq. 6; HFX paper §3.3.2).

A request may carry a priority p in [0, N−1] instead of an SLO. **0 is the most important**
(other systems use the opposite direction). The mapper turns p into a (TTFT, TPOT) SLO from what
the system achieved recently:

1. Two sliding windows of the last W completed requests: observed TTFTs (each with its queue
   time, dispatch − arrival) and observed TPOTs, each kept sorted, with C_i, the number of
   requests of priority i in the window.
2. Eq. 6: base = Σ_{i<p} C_i, offset = ⌊(p+1)/(N+1) · C_p⌋, index = base + offset. Higher
   priorities read lower-latency quantiles.
3. TTFT and its queue time, and TPOT, are read at that index. The TTFT is corrected by the change
   in queue time since the last request of the same priority (Algorithm 2:
   Δ = q_time − last_queue_time[p]; ttft −= Δ; last_queue_time[p] = q_time), so a passing queue
   spike does not inflate SLOs. A priority's first request has Δ = 0.
4. Clamping (our reading of the contention rule): while any request of a higher priority is
   pending — arrived and still without its first token — the SLO is clamped into
   [min(p), max(p)], "the strict lower bound". Otherwise the lower bound is relaxed to the
   strictest priority's min(0), so that a lower priority may be given a tight SLO and finish
   sooner when nobody more important is waiting; the upper bound max(p) always holds.
5. An empty window falls back to the middle of the priority's range.

Ranges (HyperFlexis §7.3): each priority's nominal SLO ± 25%; with ``--priorities N`` on a task
set, the nominal SLO of a priority is the Table 1 SLO of its tasks (their median when several).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from hfx.request import SLO

DEFAULT_WINDOW = 200  # completed requests per window (the seed gives no value)
RANGE_SPREAD = 0.25  # ± around the nominal SLO (HyperFlexis §7.3)


@dataclass(frozen=True, slots=True)
class PriorityRange:
    lo: SLO
    hi: SLO

    @classmethod
    def around(cls, nominal: SLO, spread: float = RANGE_SPREAD) -> PriorityRange:
        return cls(SLO(nominal.ttft * (1 - spread), nominal.tpot * (1 - spread)),
                   SLO(nominal.ttft * (1 + spread), nominal.tpot * (1 + spread)))

    @property
    def nominal(self) -> SLO:
        return SLO((self.lo.ttft + self.hi.ttft) / 2, (self.lo.tpot + self.hi.tpot) / 2)


def eq6_index(p: int, counts: Sequence[int]) -> int:
    """Eq. 6: base + offset, the window index of priority p's provisional SLO."""
    n = len(counts)
    base = sum(counts[:p])
    offset = (p + 1) * counts[p] // (n + 1)
    return base + offset


class PriorityMapper:
    def __init__(self, ranges: Sequence[PriorityRange], window: int = DEFAULT_WINDOW) -> None:
        if not ranges:
            raise ValueError("need at least one priority range")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.ranges = list(ranges)
        self.window = window
        self._fifo: deque[tuple[float, float, float, int]] = deque()  # ttft, q, tpot, priority
        self._ttfts: list[tuple[float, float]] = []  # sorted (ttft, queue time)
        self._tpots: list[float] = []  # sorted
        self.counts = [0] * len(ranges)
        self._last_queue_time: list[float | None] = [None] * len(ranges)

    @property
    def levels(self) -> int:
        return len(self.ranges)

    def check(self, priority: int) -> None:
        if not 0 <= priority < self.levels:
            raise ValueError(f"priority must be in [0, {self.levels - 1}] (0 is the most "
                             f"important), got {priority}")

    def observe(self, priority: int, ttft: float, queue_time: float, tpot: float) -> None:
        """A request of ``priority`` completed with these observed latencies."""
        self.check(priority)
        if len(self._fifo) == self.window:
            old_ttft, old_q, old_tpot, old_p = self._fifo.popleft()
            del self._ttfts[bisect.bisect_left(self._ttfts, (old_ttft, old_q))]
            del self._tpots[bisect.bisect_left(self._tpots, old_tpot)]
            self.counts[old_p] -= 1
        self._fifo.append((ttft, queue_time, tpot, priority))
        bisect.insort(self._ttfts, (ttft, queue_time))
        bisect.insort(self._tpots, tpot)
        self.counts[priority] += 1

    def assign(self, priority: int, higher_pending: bool) -> SLO:
        """Algorithm 2: the SLO for a new request of ``priority``."""
        self.check(priority)
        rng = self.ranges[priority]
        if not self._fifo:
            return rng.nominal
        idx = min(eq6_index(priority, self.counts), len(self._fifo) - 1)
        ttft, q_time = self._ttfts[idx]
        tpot = self._tpots[idx]
        last = self._last_queue_time[priority]
        ttft -= 0.0 if last is None else q_time - last
        self._last_queue_time[priority] = q_time
        lo = rng.lo if higher_pending else self.ranges[0].lo
        return SLO(min(max(ttft, lo.ttft), rng.hi.ttft), min(max(tpot, lo.tpot), rng.hi.tpot))
