"""LoRA affinity scores for picking an engine: hot 0.95-1.0, loading 0.9, warm 0.75-0.8;
where the adapter is cold, engines rank by rendezvous hashing of the adapter (0.6 for its home
engine down to 0.2), so a cold adapter lands on the same engine each time instead of being
copied onto every engine's warm tier."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from kvstack.lora.residency import EngineCache, ResidencyTier

__all__ = ["WARM_SCORE", "affinity_scores", "pick_engine", "rendezvous_order"]

WARM_SCORE = 0.75  # scores from here up: the adapter is warm, loading or hot there


def affinity_scores(
    adapter_name: str,
    engine_urls: Sequence[str],
    caches: Mapping[str, EngineCache],
    loading: Mapping[str, bool],
) -> dict[str, float]:
    """Scores in [0, 1] per engine URL; ``loading[url]``: a load of the adapter is under way.

    Within each band the adapter's home engines score a little higher, so that where several
    engines hold a copy, traffic gathers on the home one and the others' copies age out."""
    order = rendezvous_order(adapter_name, engine_urls)
    last = max(1, len(order) - 1)
    scores: dict[str, float] = {}
    for rank, url in enumerate(order):
        home = 1.0 - rank / last  # 1.0 at home, 0.0 for the last engine
        cache = caches.get(url)
        tier = cache.residency(adapter_name) if cache is not None else ResidencyTier.COLD
        if loading.get(url, False):
            scores[url] = 0.9
        elif tier is ResidencyTier.HOT:
            scores[url] = 0.95 + 0.05 * home
        elif tier is ResidencyTier.WARM:
            scores[url] = WARM_SCORE + 0.05 * home
        else:
            scores[url] = 0.2 + 0.4 * home
    return scores


def pick_engine(scores: Mapping[str, float], in_flight: Mapping[str, int], slack: int) -> str:
    """A reference picker: the best affinity among engines at most ``slack`` requests busier
    than the least busy; but rather than a cold start, an engine holding the adapter up to
    ``4 * slack`` busier (a cold load costs more than a short queue)."""
    least = min(in_flight.values())

    def best(limit: int) -> str:
        open_ = [u for u in scores if in_flight[u] <= least + limit]
        return max(open_, key=lambda u: (scores[u], -in_flight[u]))

    chosen = best(slack)
    if scores[chosen] >= WARM_SCORE:
        return chosen
    fallback = best(4 * slack)
    return fallback if scores[fallback] >= WARM_SCORE else chosen


def rendezvous_order(adapter_name: str, engine_urls: Sequence[str]) -> list[str]:
    """Engines in the adapter's rendezvous order: the first is its home. Adding or removing
    an engine moves only the adapters whose home it is."""
    return sorted(engine_urls, key=lambda u: _rendezvous(adapter_name, u), reverse=True)


def _rendezvous(adapter_name: str, url: str) -> int:
    digest = hashlib.blake2b(f"{adapter_name}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
