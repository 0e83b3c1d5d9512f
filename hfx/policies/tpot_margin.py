# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""The share of each TPOT target HFX's guard aims at (``tpot_margin`` "learned"), learned per
target from the requests that finished with it.

Algorithm 1's payback (HyperFlexis §5.1) lets an instance take prefills until the mean TPOT of
its running batch reaches the tightest target in flight exactly, and Eq. 5 budgets a prompt to
the same edge. Under a backlog every instance is kept there, and the steps' noise puts about
half of the requests over it: on PolyServe's 20 instances (tiered-512-512, 640 req/s, seed 0)
the 30 ms tier's part, backlogged, ran a mean TPOT of 29.5 ms and attained 0.379; with the
share learned here, 27.5 ms and 0.897 (the whole run 0.854 → 0.959;
bench/experiments/part_sizes.py --margin, docs/data/tpot_margin/). A fixed share
costs where the TTFTs bind and the TPOTs are met anyway: on the held-out slos-serve-mixed
(2 instances) HFX's capacity fell 9.0 → 8.5 req/s at 0.9 (bench/experiments/tpot_margin.py).
So each target's share follows its own misses, as an integral controller on its TPOT
attainment: every finished request with that target moves it by ``STEP`` × (the miss rate
allowed − 1 if it missed, else 0), within [``FLOOR``, 1]. It rests at 1 while fewer than
``MISS_RATE`` of the requests miss their TPOT, and settles where about that many do.
"""

from __future__ import annotations

MISS_RATE = 0.02  # the share of a target's requests that may miss it before the guard tightens
# How far one finished request moves its target's share: a part finishing ~100 requests/s at
# a 60% miss rate tightens by ~0.1 a second; it relaxes 50× slower than it tightens.
STEP = 0.002
FLOOR = 0.8  # the tightest share: past this the TTFTs it holds prompts back for pay more


class TPOTMargins:
    """Each TPOT target's share (1 until its requests miss)."""

    __slots__ = ("_share",)

    def __init__(self) -> None:
        self._share: dict[float, float] = {}

    def aim(self, tpot: float) -> float:
        """The TPOT the guard keeps for a target of ``tpot``."""
        return tpot * self.share(tpot)

    def share(self, tpot: float) -> float:
        return self._share.get(tpot, 1.0)

    def observe(self, target: float, measured: float) -> None:
        """A request with TPOT target ``target`` finished with mean TPOT ``measured``."""
        share = self._share.get(target, 1.0)
        missed = 1.0 if measured > target else 0.0
        self._share[target] = min(1.0, max(FLOOR, share - STEP * (missed - MISS_RATE)))
