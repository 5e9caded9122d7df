"""``ObjectiveBook``: InferenceObjectives and InferenceModels as router priorities and routes.

**InferenceObjective** (``inference.networking.x-k8s.io/v1alpha2``) has an integer
``spec.priority`` (unset counts as 0; higher is more important; negative is allowed) and a
``poolRef``; a request names its objective in the ``x-gateway-inference-objective`` header.
kvstack's admission has three classes, so the integer maps to a band::

    priority > 0   -> critical   (never held or shed by kvstack's priority admission)
    priority == 0  -> standard   (and unset, and an objective the EPP does not know)
    priority < 0   -> sheddable  (shed first, with 429 + Retry-After, when the pool is saturated)

GIE's own flow control orders every integer level; kvstack keeps three bands, so two positive
priorities (1 and 10) are both ``critical``.

**InferenceModel** (the older ``v1alpha2`` kind, before the objective split) names a client
``modelName`` with a ``criticality`` (``Critical`` / ``Standard`` / ``Sheddable`` → the same
bands) and weighted ``targetModels``: those become router model routes, so the body's ``model``
is rewritten to the chosen target exactly as a configured canary route rewrites it.

Only objects whose ``poolRef`` names this EPP's pool count. A request's own
``x-kvstack-priority`` header still wins over both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kvstack.router.config import ModelRoute

__all__ = ["CRITICALITY", "ObjectiveBook", "priority_band"]

log = logging.getLogger(__name__)
CRITICALITY = {"Critical": "critical", "Standard": "standard", "Sheddable": "sheddable"}


def priority_band(priority: object) -> str:
    """The kvstack priority of an InferenceObjective's integer ``priority`` (table above)."""
    if priority is None:
        return "standard"
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if priority > 0:
        return "critical"
    return "sheddable" if priority < 0 else "standard"


class ObjectiveBook:
    """The current objectives and InferenceModels of one pool (replaced per watch snapshot)."""

    def __init__(self, pool: str | None = None) -> None:
        self.pool = pool
        self.objectives: dict[str, str] = {}  # objective name -> band
        self.model_priorities: dict[str, str] = {}  # InferenceModel modelName -> band
        self.routes: dict[str, ModelRoute] = {}  # InferenceModel modelName -> weighted route

    def priority(self, objective: str | None, model: str) -> str | None:
        """The band for a request naming ``objective`` (header) and asking for ``model``."""
        if objective:
            return self.objectives.get(objective, "standard")
        return self.model_priorities.get(model)

    def apply_objectives(self, objects: Mapping[str, Mapping[str, Any]]) -> None:
        bands = {}
        for name, obj in objects.items():
            spec = obj.get("spec") or {}
            if not self._ours(spec):
                continue
            try:
                bands[name] = priority_band(spec.get("priority"))
            except ValueError as exc:
                log.warning("InferenceObjective %s ignored: %s", name, exc)
        self.objectives = bands

    def apply_inference_models(self, objects: Mapping[str, Mapping[str, Any]]) -> None:
        priorities: dict[str, str] = {}
        routes: dict[str, ModelRoute] = {}
        for name, obj in objects.items():
            spec = obj.get("spec") or {}
            model = spec.get("modelName")
            if not self._ours(spec) or not isinstance(model, str) or not model:
                continue
            criticality = spec.get("criticality")
            if criticality is not None:
                if criticality not in CRITICALITY:
                    log.warning("InferenceModel %s: unknown criticality %r", name, criticality)
                else:
                    priorities[model] = CRITICALITY[criticality]
            route = _route(name, model, spec.get("targetModels") or [])
            if route is not None:
                routes[model] = route
        self.model_priorities, self.routes = priorities, routes

    def _ours(self, spec: Mapping[str, Any]) -> bool:
        ref = spec.get("poolRef") or {}
        return self.pool is None or ref.get("name") == self.pool


def _route(name: str, model: str, targets: list[Any]) -> ModelRoute | None:
    """Weighted targets as a route; unset weights count equally (GIE: all set or none)."""
    entries = [
        {"model": t["name"], "weight": t.get("weight") or 1}
        for t in targets
        if isinstance(t, Mapping) and t.get("name") and t.get("weight", 1) != 0
    ]
    if not entries:
        return None
    try:
        return ModelRoute.model_validate({"name": model, "targets": entries})
    except ValidationError as exc:
        log.warning("InferenceModel %s ignored: %s", name, exc)
        return None
