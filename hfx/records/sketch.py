"""Quantiles in bounded memory: a log-bucketed histogram with a relative-accuracy guarantee
(DDSketch, Masson, Rim and Lee, VLDB 2019, §2).

A positive value ``x`` is counted in bucket ``ceil(log_γ x)`` with ``γ = (1 + α) / (1 - α)``;
the bucket's representative ``2γ^i / (γ + 1)`` is within relative error ``α`` of every value in
it. Zeros are counted apart. ``percentile`` answers like ``np.percentile`` (linear interpolation
between the two order statistics around the rank) with each order statistic replaced by its
bucket's representative, so for non-negative values the answer is within ``α`` of
``np.percentile``'s, relatively. Buckets are a dense array over ``[LOW, HIGH]`` seconds
(values outside are clamped to its ends: latencies below a nanosecond or above ~11 days).
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.005  # relative accuracy: the reported percentiles are within 0.5% of the exact ones
LOW, HIGH = 1e-9, 1e6  # seconds


class LatencySketch:
    """Count, sum and a DDSketch of non-negative values (NaN counted apart)."""

    def __init__(self, alpha: float = ALPHA) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"relative accuracy must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self._log_gamma = math.log((1 + alpha) / (1 - alpha))
        self._offset = math.ceil(math.log(LOW) / self._log_gamma)
        self._counts = np.zeros(math.ceil(math.log(HIGH) / self._log_gamma) - self._offset + 1,
                                dtype=np.int64)
        self.zeros = 0
        self.nans = 0
        self.count = 0  # every value added, NaN included
        self.total = 0.0  # the sum of the non-NaN values

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        self.count += len(values)
        nan = np.isnan(values)
        self.nans += int(nan.sum())
        values = values[~nan]
        if np.any(values < 0):
            raise ValueError("a latency sketch takes non-negative values")
        self.total += float(values.sum())
        positive = values[values > 0]
        self.zeros += len(values) - len(positive)
        if len(positive):
            index = np.ceil(np.log(positive) / self._log_gamma).astype(np.int64) - self._offset
            np.clip(index, 0, len(self._counts) - 1, out=index)
            self._counts += np.bincount(index, minlength=len(self._counts))

    def _value(self, k: int) -> float:
        """The representative of the ``k``-th smallest value (0-based)."""
        if k < self.zeros:
            return 0.0
        cumulative = np.cumsum(self._counts)
        i = int(np.searchsorted(cumulative, k - self.zeros, side="right"))
        gamma = math.exp(self._log_gamma)
        return 2 * math.exp((i + self._offset) * self._log_gamma) / (gamma + 1)

    def percentile(self, q: float) -> float:
        """``np.percentile(values, q)`` within relative ``alpha``; NaN if any value was NaN."""
        n = self.count - self.nans
        if self.nans or not n:
            return math.nan
        rank = q / 100 * (n - 1)
        lo, hi = math.floor(rank), math.ceil(rank)
        low = self._value(lo)
        return low if hi == lo else low + (rank - lo) * (self._value(hi) - low)

    def mean(self) -> float:
        n = self.count - self.nans
        return math.nan if self.nans or not n else self.total / n
