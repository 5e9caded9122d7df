"""LoRA affinity scores for picking an engine: hot 1.0, loading 0.9, warm 0.8; where the
adapter is cold, engines rank by rendezvous hashing of the adapter (0.6 for its home engine
down to 0.2), so a cold adapter lands on the same engine each time instead of being copied
onto every engine's warm tier."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from kvstack.lora.residency import EngineCache, Tier

__all__ = ["affinity_scores", "rendezvous_order"]


def affinity_scores(
    adapter_name: str,
    engine_urls: Sequence[str],
    caches: Mapping[str, EngineCache],
    loading: Mapping[str, bool],
) -> dict[str, float]:
    """Scores in [0, 1] per engine URL; ``loading[url]``: a load of the adapter is under way."""
    scores: dict[str, float] = {}
    cold = []
    for url in engine_urls:
        cache = caches.get(url)
        tier = cache.residency(adapter_name) if cache is not None else Tier.COLD
        if loading.get(url, False):
            scores[url] = 0.9
        elif tier is not Tier.COLD:
            scores[url] = 1.0 if tier is Tier.HOT else 0.8
        else:
            cold.append(url)
    ranked = rendezvous_order(adapter_name, cold)
    for i, url in enumerate(ranked):
        scores[url] = 0.6 - 0.4 * i / max(1, len(ranked) - 1)
    return scores


def _rendezvous(adapter_name: str, url: str) -> int:
    digest = hashlib.blake2b(f"{adapter_name}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def rendezvous_order(adapter_name: str, engine_urls: Sequence[str]) -> list[str]:
    """Engines in the adapter's rendezvous order: the first is its home. Adding or removing
    an engine moves only the adapters whose home it is."""
    return sorted(engine_urls, key=lambda u: _rendezvous(adapter_name, u), reverse=True)
