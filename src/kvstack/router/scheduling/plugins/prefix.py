"""``prefix`` scorer: the share of the prompt a backend holds, credited by tier.

Score = tier-weighted cached tokens / prompt tokens, from the shared prefix state (KV events
in precise mode, the router's routed belief otherwise, kvstack tiers from the index server).
On its own it piles a hot prefix onto one backend; pair it with a load scorer (the ``prefix``
policy: prefix 3, least_load 2, as llm-d weighs them) or use the ``ttft`` cost model, which
trades the two off in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvstack.router.fleet.backends import BackendView
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.config import DEFAULT_TIER_WEIGHTS
from kvstack.router.scheduling.plugins.base import LazyNotes, PluginContext, Scorer, ScoreResult
from kvstack.router.scheduling.services import prefix_state

__all__ = ["PrefixScorer"]


class PrefixScorer(Scorer):
    name = "prefix"

    def __init__(self, context: PluginContext, tier_weights: Mapping[str, float] | None = None):
        super().__init__(context)
        self.state = prefix_state(context)
        self.weights = {**DEFAULT_TIER_WEIGHTS, **self.state.config.tier_weights}
        self.weights.update(tier_weights or {})

    def score(self, request: RoutingRequest, backends: Sequence[BackendView]) -> ScoreResult:
        view = self.state.view(request, backends)
        total = max(1, view.num_tokens)
        scores = {b.id: min(1.0, view.credit(b.id, self.weights) / total) for b in backends}
        return ScoreResult(scores, details=LazyNotes(view.note, scores))
