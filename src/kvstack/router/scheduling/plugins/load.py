"""Least-load scorer: fewer requests on the backend scores higher."""

from __future__ import annotations

from collections.abc import Sequence

from kvstack.router.fleet.backends import BackendView
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import Scorer, ScoreResult

__all__ = ["LeastLoadScorer"]


class LeastLoadScorer(Scorer):
    """Score = (max − load) / (max − min) over the candidates, 1.0 for all when equal.

    Load is :attr:`BackendView.estimated_requests`: the router's in-flight requests (counted at
    decision time, so a burst spreads at once) plus the engine's running and waiting requests
    this router did not send, from a fresh scrape.
    """

    name = "least_load"

    def score(self, request: RoutingRequest, backends: Sequence[BackendView]) -> ScoreResult:
        loads = {b.id: b.estimated_requests for b in backends}
        low, high = min(loads.values()), max(loads.values())
        if high == low:
            return ScoreResult(dict.fromkeys(loads, 1.0))
        span = high - low
        return ScoreResult({i: (high - load) / span for i, load in loads.items()})
