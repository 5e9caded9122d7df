"""Model routing: the name a client asks for → the model or adapter the backends must serve.

Resolution order: an alias is replaced by its target name; a route picks one of its weighted
targets (canary and A/B releases), only among targets some backend serves while any does; a
name some backend serves is its own target; anything else is a 404 listing the known names.
A sticky route hashes the session (or user) so one user always sees the same target.

What can be served is judged from the backends' latest model lists (and the adapter registry,
when one is wired in): ``listed`` leaves out a route whose every target is unserved and an
alias that points at nothing servable, and ``unserved`` names each target no backend serves
(the router logs them at start). Both read the lists as they are when called, so when a
backend reports its models later (the health checker re-reads them every
``health.models_interval_s``) ``/v1/models`` and the next check follow at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import xxhash

from kvstack.errors import NoBackendError, UnknownModelError
from kvstack.router.config import ModelRoute, ModelTarget
from kvstack.router.fleet.backends import BackendState

__all__ = ["ModelRouter", "RouteResolution", "UnservedTarget"]


class RouteResolution(NamedTuple):
    target: str
    route: str | None  # the route that chose it, if any


class UnservedTarget(NamedTuple):
    """A configured target that no backend serves now."""

    name: str  # the route or alias that points at it
    target: str
    fallback: bool  # whether another target of the same route is served


class ModelRouter:
    """``registered``: whether a name is known elsewhere (the adapter registry), and so is
    servable although no backend lists it yet."""

    def __init__(
        self,
        routes: Sequence[ModelRoute],
        aliases: Mapping[str, str],
        rng: random.Random | None = None,
        registered: Callable[[str], bool] | None = None,
    ) -> None:
        self.routes = {r.name: r for r in routes}
        self.aliases = dict(aliases)
        self._rng = rng or random.Random()
        self._registered = registered or _nowhere

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
        return sorted(_served_names(states) | set(self.routes) | set(self.aliases))

    def listed(self, states: Sequence[BackendState]) -> list[dict[str, Any]]:
        """``/v1/models`` entries for the routes and aliases that can be served now."""
        served = _served_names(states)
        entries = []
        for route in self.routes.values():
            targets = [t.model for t in route.targets if self._servable(t.model, served)]
            if targets:
                entries.append(_entry(route.name, targets[0]))
        for alias, target in self.aliases.items():
            if self._alias_servable(target, served):
                entries.append(_entry(alias, target))
        return entries

    def unserved(self, states: Sequence[BackendState]) -> list[UnservedTarget]:
        """Every route target and alias target that nothing can serve now, in config order."""
        served = _served_names(states)
        found = []
        for route in self.routes.values():
            missing = [t.model for t in route.targets if not self._servable(t.model, served)]
            fallback = len(missing) < len(route.targets)
            found += [UnservedTarget(route.name, m, fallback) for m in missing]
        for alias, target in self.aliases.items():
            if target not in self.routes and not self._servable(target, served):
                found.append(UnservedTarget(alias, target, False))
        return found

    def _servable(self, model: str, served: set[str]) -> bool:
        return model in served or self._registered(model)

    def _alias_servable(self, target: str, served: set[str]) -> bool:
        route = self.routes.get(target)
        if route is None:
            return self._servable(target, served)
        return any(self._servable(t.model, served) for t in route.targets)

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


def _nowhere(model: str) -> bool:
    return False


def _served_names(states: Sequence[BackendState]) -> set[str]:
    return set().union(*(s.models for s in states)) if states else set()


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
