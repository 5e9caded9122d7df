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
    """The best score; among ties the backend this picker chose least recently (never chosen
    first, in candidate order). With no scorers that is round-robin. A counter taken modulo
    the number of ties is not: when the tie set changes between picks (a backend's load score
    moves, one gains a prefix), it can land on the backend it just chose and leave another
    idle."""

    name = "max_score"
    tie_reason = "round_robin"

    def __init__(self, context: PluginContext) -> None:
        super().__init__(context)
        self._turn = 0
        self._last: dict[str, int] = {}  # backend id -> the turn it was last chosen

    def pick(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Candidate:
        ties = _ties(candidates)
        if len(ties) > 1:
            chosen = min(ties, key=lambda c: self._last.get(c.backend.id, -1))
        else:
            chosen = ties[0]
        self._turn += 1
        self._last[chosen.backend.id] = self._turn
        if len(self._last) > 4 * len(candidates) + 64:  # backends that left the fleet
            live = {c.backend.id for c in candidates}
            self._last = {k: v for k, v in self._last.items() if k in live}
        return chosen


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
