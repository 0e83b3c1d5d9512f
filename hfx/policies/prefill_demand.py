# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The fleet's prefill demand: the share of each instance's time the prompts that arrived over
the last ``window`` seconds need, at Eq. 1's per-token cost (HyperFlexis §3).

HFX keeps a TPOT target T on an instance by Algorithm 1's payback: after a prefill of E_p it
waits (E_p / (T − E_d))·E_d, so the instance prefills at most a share 1 − E_d / T of its
time. Where the arrivals need more than that, guarding T holds prompts in Q_R until their
TTFT is lost, and T is missed anyway once the queue is past saving. ``guard_floor`` is the
tightest TPOT whose payback leaves room for the demand (hfx/policies/hfx.py,
``guard_tpots``). Only the per-token terms count (b, c): a batch shares its fixed cost, so the
demand is a floor, and the rule gives a target up only where even that floor does not fit
(but for prefix-cache hits, which it does not know at arrival: with caching it overstates).
"""

from __future__ import annotations

from collections import deque

# Seconds of arrivals the demand is measured over (ours): long enough to hold a few hundred
# arrivals at a 2-instance knee, short next to a run's minutes.
DEMAND_WINDOW = 10.0


class PrefillDemand:
    __slots__ = ("_arrivals", "_first", "_sum", "window")

    def __init__(self, window: float = DEMAND_WINDOW) -> None:
        if window <= 0:
            raise ValueError(f"demand window must be positive, got {window}")
        self.window = window
        self._arrivals: deque[tuple[float, float]] = deque()  # (time, prefill seconds)
        self._sum = 0.0
        self._first: float | None = None  # the first arrival's time

    def add(self, now: float, seconds: float) -> None:
        if self._first is None:
            self._first = now
        self._arrivals.append((now, seconds))
        self._sum += seconds

    def share(self, now: float, instances: int) -> float:
        """Prefill seconds per second per instance over the last ``window`` seconds (over the
        time since the first arrival, while that is shorter, and at least a second)."""
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] < now - self.window:
            self._sum -= arrivals.popleft()[1]
        if not arrivals:
            self._sum = 0.0  # no float residue carried into the next arrivals
            return 0.0
        if instances <= 0 or self._first is None:
            return 0.0
        span = min(self.window, max(now - self._first, 1.0))
        return max(0.0, self._sum) / span / instances


def guard_floor(e_d: float, share: float) -> float:
    """The tightest TPOT Algorithm 1's payback can keep beside decode steps of ``e_d`` when the
    prompts need ``share`` of the instance's time: E_d / (1 − share); inf at or past 1."""
    if share >= 1.0:
        return float("inf")
    return e_d / (1.0 - share)
