"""Adapter eviction policies: small strategy classes that pick a victim among candidates.

The cache hands a policy only adapters it may evict (not in use, not loading, not pinned unless
nothing else is left); the policy orders them. Both policies see the same candidates, so they
are compared at equal memory.

- ``lru``: the least recently requested adapter first (the engines' own policy; the baseline).
- ``weighted-lru``: a superseded version (no request is routed to it any more) first; then the
  lowest hot score, ties by recency. The score weighs the decayed request rate (its percentile
  rank among the candidates), the time it would take to bring the adapter back (relative to
  the slowest), its tenant tier's priority, and a scheduled-warmup bonus.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvstack.lora.config import AdapterCachePolicy, HotScoreWeights
from kvstack.lora.facts import AdapterFacts
from kvstack.registry import Registry

__all__ = [
    "POLICIES",
    "AdapterLRUPolicy",
    "AdapterPolicy",
    "EvictionCandidate",
    "WeightedLRUPolicy",
    "make_policy",
]


@dataclass(frozen=True, slots=True)
class EvictionCandidate:
    name: str
    facts: AdapterFacts
    last_request_at: float
    reload_s: float  # predicted time to make it hot again if evicted


class AdapterPolicy(ABC):
    @abstractmethod
    def victim(self, candidates: Sequence[EvictionCandidate]) -> EvictionCandidate | None:
        """The candidate to evict first, or None when there is none. Pure: no side effects."""


class AdapterLRUPolicy(AdapterPolicy):
    def victim(self, candidates: Sequence[EvictionCandidate]) -> EvictionCandidate | None:
        return min(candidates, key=lambda c: (c.last_request_at, c.name), default=None)


class WeightedLRUPolicy(AdapterPolicy):
    def __init__(self, weights: HotScoreWeights, priority_weights: Mapping[str, float]) -> None:
        self.weights = weights
        self.priority_weights = dict(priority_weights)

    def victim(self, candidates: Sequence[EvictionCandidate]) -> EvictionCandidate | None:
        if not candidates:
            return None
        qps_rank = _percentile_ranks([c.facts.qps_30m for c in candidates])
        max_reload = max(c.reload_s for c in candidates) or 1.0
        scored = [
            (
                c.facts.is_current,
                self.score(c, qps_rank[i], c.reload_s / max_reload),
                c.last_request_at,
                c.name,
                c,
            )
            for i, c in enumerate(candidates)
        ]
        return min(scored, key=lambda t: t[:4])[4]

    def score(self, c: EvictionCandidate, qps_feature: float, reload_feature: float) -> float:
        w = self.weights
        return (
            w.qps_30m * qps_feature
            + w.ttft_penalty_if_cold * reload_feature
            + w.tenant_priority * self.priority_weights.get(c.facts.tenant_priority, 0.0)
            + w.scheduled_warmup * (1.0 if c.facts.scheduled_warmup else 0.0)
        )


def _percentile_ranks(values: Sequence[float]) -> list[float]:
    """Each value's rank among the others in [0, 1] (ties share the lower rank). Request rates
    under Zipf span orders of magnitude; dividing by the maximum would squash all but the top
    few to ~0 and let the tier term decide alone, while ranks keep popularity comparable."""
    if len(values) == 1:
        return [1.0]
    order = sorted(values)
    rank: dict[float, int] = {}
    for i, v in enumerate(order):
        rank.setdefault(v, i)
    return [rank[v] / (len(values) - 1) for v in values]


PolicyFactory = Callable[[AdapterCachePolicy, Mapping[str, float]], AdapterPolicy]
POLICIES: Registry[PolicyFactory] = Registry("adapter eviction policy")
POLICIES.register("lru", lambda _policy, _weights: AdapterLRUPolicy())
POLICIES.register(
    "weighted-lru", lambda policy, weights: WeightedLRUPolicy(policy.hot_score, weights)
)


def make_policy(policy: AdapterCachePolicy, priority_weights: Mapping[str, float]) -> AdapterPolicy:
    return POLICIES.get(policy.eviction_policy)(policy, priority_weights)
