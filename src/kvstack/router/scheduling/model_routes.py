"""Model routing: the name a client asks for → the model or adapter the backends must serve.

Resolution order: an alias is replaced by its target name; a route picks one of its weighted
targets (canary and A/B releases), only among targets some backend serves while any does; a
name some backend serves is its own target; anything else is a 404 listing the known names.
A sticky route hashes the session (or user) so one user always sees the same target.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import xxhash

from kvstack.errors import NoBackendError, UnknownModelError
from kvstack.router.config import ModelRoute, ModelTarget
from kvstack.router.fleet.backends import BackendState

__all__ = ["ModelRouter", "RouteResolution"]


class RouteResolution(NamedTuple):
    target: str
    route: str | None  # the route that chose it, if any


class ModelRouter:
    def __init__(
        self,
        routes: Sequence[ModelRoute],
        aliases: Mapping[str, str],
        rng: random.Random | None = None,
    ) -> None:
        self.routes = {r.name: r for r in routes}
        self.aliases = dict(aliases)
        self._rng = rng or random.Random()

    def resolve(
        self, model: str, states: Sequence[BackendState], session_key: str | None = None
    ) -> RouteResolution:
        name = self.aliases.get(model, model)
        route = self.routes.get(name)
        if route is not None:
            return RouteResolution(self._pick_target(route, states, session_key), route.name)
        if any(name in s.models for s in states):
            return RouteResolution(name, None)
        if states and not any(s.models for s in states):
            raise NoBackendError(_why_no_models(states))
        raise UnknownModelError(model, self.known(states))

    def known(self, states: Sequence[BackendState]) -> list[str]:
        served: set[str] = set().union(*(s.models for s in states)) if states else set()
        return sorted(served | set(self.routes) | set(self.aliases))

    def listed(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries for routes and aliases."""
        entries = [_entry(r.name, r.targets[0].model) for r in self.routes.values()]
        entries += [_entry(alias, target) for alias, target in self.aliases.items()]
        return entries

    def _pick_target(
        self, route: ModelRoute, states: Sequence[BackendState], session_key: str | None
    ) -> str:
        served = [t for t in route.targets if any(t.model in s.models for s in states)]
        targets = served or route.targets
        if len(targets) == 1:
            return targets[0].model
        if route.sticky and session_key:
            point = xxhash.xxh64_intdigest(f"{route.name}\0{session_key}".encode()) / 2.0**64
        else:
            point = self._rng.random()
        return _weighted(targets, point)


def _why_no_models(states: Sequence[BackendState]) -> str:
    """The backends' own failures (``connection refused to …``) when they have any."""
    errors = sorted({s.last_error for s in states if s.last_error})
    if errors:
        return f"no backend can serve: {'; '.join(errors)}"
    return "no backend has reported its models yet"


def _weighted(targets: Sequence[ModelTarget], point: float) -> str:
    """The target whose cumulative weight interval holds ``point`` ∈ [0, 1)."""
    total = sum(t.weight for t in targets)
    edge = 0.0
    for target in targets:
        edge += target.weight / total
        if point < edge:
            return target.model
    return targets[-1].model


def _entry(name: str, root: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kvstack", "root": root}
