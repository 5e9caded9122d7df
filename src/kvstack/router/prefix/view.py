"""``PrefixView``: how much of one request's prompt each backend holds, tier by tier, and the
tier-weighted credit that the scorers and the cost model use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_WEIGHT", "PrefixView", "credited_tokens"]

DEFAULT_WEIGHT = 0.5  # a tier without a configured weight


def credited_tokens(tiers: Mapping[str, int], weights: Mapping[str, float]) -> float:
    """Cached tokens credited by tier: each token counts once, at the best weight of the tiers
    holding it (tiers hold prefixes, so a longer match in a worse tier adds only its tail)."""
    if len(tiers) <= 1:  # the common case (one tier, or none): nothing to order
        for tier, tokens in tiers.items():
            return weights.get(tier, DEFAULT_WEIGHT) * tokens if tokens > 0 else 0.0
        return 0.0
    credit = 0.0
    covered = 0
    for tier, tokens in sorted(tiers.items(), key=lambda kv: -weights.get(kv[0], DEFAULT_WEIGHT)):
        if tokens > covered:
            credit += weights.get(tier, DEFAULT_WEIGHT) * (tokens - covered)
            covered = tokens
    return credit


@dataclass(frozen=True, slots=True)
class PrefixView:
    num_tokens: int  # the prompt's tokens
    exact: bool  # tokenized as the engines do (else character blocks: routed beliefs only)
    tiers: dict[str, dict[str, int]] = field(default_factory=dict)  # backend -> tier -> tokens
    precise: frozenset[str] = frozenset()  # backends whose device tier comes from KV events
    fullness: dict[str, float] = field(default_factory=dict)  # cached share of KV capacity

    def tiers_of(self, backend_id: str) -> dict[str, int]:
        return self.tiers.get(backend_id, {})

    def credit(self, backend_id: str, weights: Mapping[str, float]) -> float:
        return credited_tokens(self.tiers_of(backend_id), weights)

    def best(self, backend_id: str) -> int:
        return max(self.tiers_of(backend_id).values(), default=0)

    def note(self, backend_id: str) -> str:
        """For the decision header: ``gpu:4096/4200`` style, best tiers first."""
        tiers = sorted(self.tiers_of(backend_id).items(), key=lambda kv: -kv[1])
        held = ",".join(f"{t}:{n}" for t, n in tiers if n) or "none"
        mode = "precise" if backend_id in self.precise else "approx"
        return f"{held}/{self.num_tokens}({mode})"
