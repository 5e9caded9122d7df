"""Pickers: choose among ranked candidates; each breaks ties its own way."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import Candidate, Picker, PluginContext

__all__ = ["MaxScorePicker", "RandomPicker", "SoftmaxPicker", "WeightedRandomPicker"]

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


class SoftmaxPicker(Picker):
    """Any candidate, with probability ∝ exp((score − best) / temperature): 0 is argmax;
    a small temperature spreads near-ties (as Dynamo's router temperature does)."""

    name = "softmax"
    tie_reason = "softmax"

    def __init__(self, context: PluginContext, temperature: float = 0.05) -> None:
        super().__init__(context)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.temperature = temperature

    def pick(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Candidate:
        if self.temperature == 0:
            return candidates[0]
        best = max(c.score for c in candidates)
        weights = [math.exp((c.score - best) / self.temperature) for c in candidates]
        return self.context.rng.choices(list(candidates), weights=weights)[0]
