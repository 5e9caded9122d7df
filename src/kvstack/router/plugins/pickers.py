"""Pickers: choose among ranked candidates; each breaks ties its own way."""

from __future__ import annotations

from collections.abc import Sequence

from kvstack.router.plugins.base import Candidate, Picker, PluginContext
from kvstack.router.request import RoutingRequest

__all__ = ["MaxScorePicker", "RandomPicker", "WeightedRandomPicker"]

_EPS = 1e-9


def _ties(candidates: Sequence[Candidate]) -> list[Candidate]:
    best = max(c.score for c in candidates)
    return [c for c in candidates if c.score >= best - _EPS]


class MaxScorePicker(Picker):
    """The best score; ties rotate round-robin (so no scorers at all means round-robin)."""

    name = "max_score"
    tie_reason = "round_robin"

    def __init__(self, context: PluginContext) -> None:
        super().__init__(context)
        self._turn = 0

    def pick(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Candidate:
        ties = _ties(candidates)
        if len(ties) == 1:
            return ties[0]
        self._turn += 1
        return ties[self._turn % len(ties)]


class RandomPicker(Picker):
    """The best score; ties broken uniformly at random."""

    name = "random"
    tie_reason = "random"

    def pick(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Candidate:
        return self.context.rng.choice(_ties(candidates))


class WeightedRandomPicker(Picker):
    """Any candidate, with probability proportional to its score (all equal when all are 0)."""

    name = "weighted_random"
    tie_reason = "weighted_random"

    def pick(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Candidate:
        weights = [max(c.score, 0.0) + _EPS for c in candidates]
        return self.context.rng.choices(list(candidates), weights=weights)[0]
