"""A seeded Zipf sampler over ranks 0..n-1 (rank 0 most popular)."""

from __future__ import annotations

import bisect
import itertools
import random

__all__ = ["ZipfSampler"]


class ZipfSampler:
    """P(rank k) proportional to 1 / (k + 1) ** s; s = 0 is uniform."""

    def __init__(self, n: int, s: float) -> None:
        if n <= 0:
            raise ValueError(f"need at least one item, got {n}")
        weights = [1.0 / (k + 1) ** s for k in range(n)]
        total = sum(weights)
        self.cdf = list(itertools.accumulate(w / total for w in weights))
        self.probabilities = [w / total for w in weights]

    def __call__(self, rng: random.Random) -> int:
        return min(bisect.bisect_left(self.cdf, rng.random()), len(self.cdf) - 1)
