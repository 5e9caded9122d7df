"""Filters: drop backends that must not (or should not) serve a request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvstack.router.fleet.backends import BackendView
from kvstack.router.fleet.saturation import SaturationLimits
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import Filter, PluginContext

__all__ = ["LabelFilter", "NotSaturatedFilter"]


class NotSaturatedFilter(Filter):
    """Drops saturated backends, unless every candidate is saturated (then keeps them all, so
    saturation degrades service instead of refusing it; shedding is the admission's job)."""

    name = "not_saturated"

    def __init__(
        self,
        context: PluginContext,
        max_waiting: float | None = 5.0,
        max_kv_usage: float | None = 0.9,
        max_in_flight: int | None = None,
    ) -> None:
        super().__init__(context)
        self.limits = SaturationLimits(max_waiting, max_kv_usage, max_in_flight)

    def filter(self, request: RoutingRequest, backends: Sequence[BackendView]) -> list[BackendView]:
        fine = [b for b in backends if self.limits.reason(b) is None]
        return fine or list(backends)


class LabelFilter(Filter):
    """Keeps backends whose labels include every ``match`` pair (e.g. a zone or a GPU type)."""

    name = "labels"

    def __init__(self, context: PluginContext, match: Mapping[str, str] | None = None) -> None:
        super().__init__(context)
        self.match = dict(match or {})

    def filter(self, request: RoutingRequest, backends: Sequence[BackendView]) -> list[BackendView]:
        return [
            b for b in backends if all(b.backend.labels.get(k) == v for k, v in self.match.items())
        ]
