"""Load-time prediction from observed histograms.

Every completed load is observed per engine and per starting tier (``warm``: files on the host,
only the engine load; ``cold``: fetch, verify and engine load). The prediction is a high
quantile (p90 by default) of the observed histogram: per engine once it has enough samples,
else across engines, else the configured prior. Counts halve once a histogram holds many
samples, so the prediction follows a change in the store's or the engines' speed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstack.lora.residency import Entry, ResidencyTier
    from kvstack.lora.stats import StatsTable

__all__ = ["LoadTimeHistogram", "LoadTimePredictor", "reload_estimate"]

# 1 ms to ~5 min in steps of 15 %: a prediction is at most 15 % above the observed quantile.
PREDICT_BUCKETS_S = tuple(0.001 * 1.15**i for i in range(90))


@dataclass(slots=True)
class LoadTimeHistogram:
    bounds: tuple[float, ...] = PREDICT_BUCKETS_S
    counts: list[float] = field(default_factory=lambda: [0.0] * (len(PREDICT_BUCKETS_S) + 1))
    max_seen_s: float = 0.0
    total: float = 0.0
    halve_at: float = 512.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1.0
        self.total += 1.0
        self.max_seen_s = max(self.max_seen_s, seconds)
        if self.total >= self.halve_at:
            self.counts = [c / 2.0 for c in self.counts]
            self.total /= 2.0

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile ``q`` (the largest sample beyond the last)."""
        target, seen = q * self.total, 0.0
        for i, count in enumerate(self.counts):
            seen += count
            if seen >= target and count > 0:
                return self.bounds[i] if i < len(self.bounds) else self.max_seen_s
        return self.max_seen_s


class LoadTimePredictor:
    def __init__(self, priors_s: dict[str, float], quantile: float = 0.9, min_samples: int = 3):
        self.priors_s = dict(priors_s)
        self.quantile = quantile
        self.min_samples = min_samples
        self._by_engine: dict[tuple[str, str], LoadTimeHistogram] = {}
        self._overall: dict[str, LoadTimeHistogram] = {}

    def observe(self, engine: str, tier: str, seconds: float) -> None:
        for hist in (
            self._by_engine.setdefault((engine, tier), LoadTimeHistogram()),
            self._overall.setdefault(tier, LoadTimeHistogram()),
        ):
            hist.observe(seconds)

    def predict(self, engine: str, tier: str) -> float:
        """Predicted seconds to make an adapter hot from ``tier`` (``warm`` or ``cold``)."""
        if tier == "hot":
            return 0.0
        for hist in (self._by_engine.get((engine, tier)), self._overall.get(tier)):
            if hist is not None and hist.total >= self.min_samples:
                return hist.quantile(self.quantile)
        return self.priors_s.get(tier, self.priors_s.get("cold", 0.0))


def reload_estimate(
    predictor: LoadTimePredictor, stats: StatsTable, engine: str, entry: Entry, tier: ResidencyTier
) -> float:
    """Seconds to bring ``entry`` back if it leaves ``tier``: its own last load from the tier
    below when one was observed here (big adapters take longer), else the prediction."""
    below = "warm" if tier.value == "hot" else "cold"
    seen = stats.peek(entry.name)
    if seen is not None and below in seen.load_s:
        return seen.load_s[below]
    return predictor.predict(engine, below)
