"""Cache counters scraped from engines' ``/metrics`` (vLLM's names; the simulator's too)."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["EngineCacheCounters", "cache_counters", "metric_total"]

_NAMES = {
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "local_hits",
    "vllm:external_prefix_cache_hits_total": "external_hits",
}


@dataclass(frozen=True)
class EngineCacheCounters:
    """Prompt-token prefix-cache counters summed over engines: looked up, found in the engine's
    own cache, loaded through a connector."""

    queries: float = 0.0
    local_hits: float = 0.0
    external_hits: float = 0.0

    def hit_rate_since(self, before: EngineCacheCounters) -> float:
        """Share of prompt tokens looked up since ``before`` that came from a cache."""
        queries = self.queries - before.queries
        hits = (self.local_hits - before.local_hits) + (self.external_hits - before.external_hits)
        return hits / queries if queries > 0 else 0.0


def _samples(url: str) -> list[tuple[str, float]]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return [(s.name, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def cache_counters(urls: Sequence[str]) -> EngineCacheCounters:
    """The counters of every engine in ``urls``, summed (a blocking scrape of each)."""
    totals = dict.fromkeys(_NAMES.values(), 0.0)
    for url in urls:
        for name, value in _samples(url):
            if name in _NAMES:
                totals[_NAMES[name]] += value
    return EngineCacheCounters(**totals)


def metric_total(url: str, name: str) -> float:
    """The sum of one engine's samples called ``name`` (0 when it has none yet)."""
    return sum(value for sample, value in _samples(url) if sample == name)
