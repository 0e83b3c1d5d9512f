# Compiled by mypyc under HFX_NATIVE=1: keep to the rules in hfx/native.py's docstring.
"""``Tally``: how many requests hold each SLO target, the tightest of them and Σ n/target.

A decode cohort's members (hfx/engine/cohort.py), a shadow's in-flight requests and HFX's
queued ones (hfx/policies/) are counted by target on every join, dispatch and finish. The
policies used ``collections.Counter``, whose ``__missing__`` and ``__delitem__`` run as Python
on each change even in compiled code (hfx/native.py). A target whose count falls to 0 leaves,
and comes back last, as in the Counter: sums over the targets keep their order. The tightest is
kept, not searched: policies ask for it at every decision, far more often than it changes.
"""

from __future__ import annotations


class Tally:
    __slots__ = ("_counts", "_tightest")

    def __init__(self) -> None:
        self._counts: dict[float, int] = {}
        self._tightest: float | None = None

    def __len__(self) -> int:
        return len(self._counts)  # distinct targets

    def add(self, target: float) -> None:
        self._counts[target] = self._counts.get(target, 0) + 1
        if self._tightest is None or target < self._tightest:
            self._tightest = target

    def discard(self, target: float) -> None:
        """One request of ``target`` left (one must have been added)."""
        left = self._counts[target] - 1
        if left:
            self._counts[target] = left
        else:
            del self._counts[target]
            if target == self._tightest:
                self._tightest = min(self._counts) if self._counts else None

    def tightest(self) -> float | None:
        return self._tightest

    def inverse_sum(self) -> float:
        """Σ count / target: for TPOT targets, the tokens per second the requests ask for."""
        return sum(n / t for t, n in self._counts.items())
