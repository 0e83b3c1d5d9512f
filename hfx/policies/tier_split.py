# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``tier-split``: the fleet split by TPOT target, each part a fixed number of instances, and
least-loaded placement within a part (PolyServe §4.2's binning, with tier sizes fixed offline
where PolyServe §4.3 moves instances between tiers as they fill).

A reference for what keeping TPOT tiers apart is worth, not a contender: its split is sized
from the workload's tier shares, which a dispatcher does not know in advance
(``split_fleet``; bench/experiments/tier_split.py). An instance that keeps a TPOT of τ must run
a step at least every τ, and each step pays Eq. 2's fixed cost a (``decode_a``) before any
work, so a share a/τ of its time is gone: on Llama-3.1-8B/H200 (a ≈ 7.2 ms) 36% at 20 ms and 7%
at 100 ms. A load balancer spreads every tier over every instance and runs them all at the
strictest pace it keeps (or gives that tier up); a split pays the strict pace only on the
instances of the strict tiers.

- ``tpots``: the parts' TPOT targets, strictest first (seconds, separated by "/": ``,``
  separates ``--policy-params``); ``groups``: how many instances each part holds (as many,
  "/"-separated): ``--policy-params tpots=0.02/0.03/0.05/0.1,groups=3/4/6/7``. The parts
  take the accepting instances in id order; if there are more or fewer of them than the
  groups add up to (an instance failed or joined), the counts are rescaled to the fleet.
- A request goes to the part of the loosest target at or below its TPOT (any of those keeps
  it; the loosest costs the least), the strictest part if its TPOT is below every target, the
  loosest part without an SLO. Within the part: the fewest outstanding tokens (prompt + max
  tokens in flight), then the lower KV usage, then the lower id — least-loaded's rule.
- No parameters: one part, the whole fleet: least-loaded.
"""

from __future__ import annotations

import bisect

from hfx.policies.base import ArrivalOrderPolicy, ClusterView, Decision, Dispatch, InstanceView
from hfx.policies.least_loaded import place


def _floats(value: str | float, what: str) -> list[float]:
    """``"0.02/0.1"`` → [0.02, 0.1]; one number may come parsed already (``--policy-params``
    reads ``groups=3`` as 3.0)."""
    if isinstance(value, (int, float)):
        return [float(value)]
    try:
        return [float(x) for x in value.split("/")] if value else []
    except ValueError:
        raise ValueError(f"tier-split: {what} must be numbers separated by '/', "
                         f"got {value!r}") from None


def largest_remainder(weights: list[float], total: int) -> list[int]:
    """``total`` split in proportion to ``weights`` (Hamilton's method: floors, then the
    largest remainders get the rest), each at least 1 where ``total`` allows (a part left at
    0 takes one from the largest, the looser on a tie)."""
    k = len(weights)
    if k == 0:
        return []
    if total < k:  # not one instance each: the strictest parts first
        return [1 if i < total else 0 for i in range(k)]
    s = sum(weights)
    exact = [total * w / s for w in weights] if s > 0 else [total / k] * k
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(k), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    for i in range(k):
        if counts[i] == 0:
            largest = max(range(k), key=lambda j: (counts[j], j))
            counts[largest] -= 1
            counts[i] = 1
    return counts


def split_fleet(instances: int, shares: list[float], tpots: list[float],
                fixed: float) -> list[int]:
    """Instances per TPOT target (``tpots`` strictest first, ``shares`` of the work each), in
    proportion to share / (1 − fixed/τ): the time an instance keeping τ has left after the
    fixed cost of a step every τ (``fixed``: Eq. 2's decode_a). A fluid count: it sizes the
    parts by work alone, as the work bound counts (hfx/evaluation/bound.py)."""
    if len(shares) != len(tpots):
        raise ValueError("split_fleet: one share per TPOT target")
    weights = []
    for share, tau in zip(shares, tpots, strict=True):
        usable = 1.0 - fixed / tau
        if usable <= 0:
            raise ValueError(f"split_fleet: a step's fixed cost {fixed * 1e3:.1f} ms leaves "
                             f"nothing of a {tau * 1e3:.0f} ms TPOT")
        weights.append(share / usable)
    return largest_remainder(weights, instances)


class TierSplit(ArrivalOrderPolicy):
    name = "tier-split"

    def __init__(self, tpots: str | float = "", groups: str | float = "") -> None:
        super().__init__()
        self.tpots = _floats(tpots, "tpots")
        sizes = _floats(groups, "groups")
        if len(sizes) != len(self.tpots):
            raise ValueError(f"tier-split: {len(self.tpots)} TPOT targets but "
                             f"{len(sizes)} group sizes")
        if any(t <= 0 for t in self.tpots) or self.tpots != sorted(set(self.tpots)):
            raise ValueError("tier-split: tpots must be positive and strictly increasing")
        if any(s < 1 or s != int(s) for s in sizes):
            raise ValueError("tier-split: each group holds a whole number of instances, >= 1")
        self.sizes = [int(s) for s in sizes]

    def part_of(self, tpot: float | None) -> int:
        """The index of the part a request of this TPOT goes to."""
        if not self.tpots:
            return 0
        if tpot is None:
            return len(self.tpots) - 1
        return max(0, bisect.bisect_right(self.tpots, tpot) - 1)

    def parts(self, targets: list[InstanceView]) -> list[list[InstanceView]]:
        """The accepting instances, in id order, cut into the parts."""
        ordered = sorted(targets, key=_id)
        if not self.sizes:
            return [ordered]
        n = len(ordered)
        sizes = self.sizes if sum(self.sizes) == n else largest_remainder(
            [float(s) for s in self.sizes], n)
        out: list[list[InstanceView]] = []
        start = 0
        for size in sizes:
            out.append(ordered[start:start + size])
            start += size
        return out

    def schedule(self, view: ClusterView) -> Decision:
        decision = Decision()
        targets = view.accepting()
        if not targets:
            return decision
        parts = self.parts(targets)
        placed: dict[int, int] = {}  # this call's own placements, as least-loaded counts them
        while self._queue:
            req = self._queue.popleft()
            part = parts[self.part_of(req.slo.tpot if req.slo is not None else None)]
            # A part left empty by a shrunk fleet: anywhere.
            decision.dispatch.append(Dispatch(req, place(req, part or targets, placed).id))
        return decision


def _id(inst: InstanceView) -> int:
    return inst.id
