"""``UnservedTargets``: one log line per model target that no backend serves.

The router calls ``check`` once at start, after the first round of health checks and model
reads, and again after every later health round (which re-reads the backends' models every
``health.models_interval_s``). Each call logs only what changed since the previous one: a
warning for each target that became unserved (once while it stays so), an info line for each
that is served again. While
no backend has reported any model there is nothing to compare against, and one line says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kvstack.router.fleet.backends import BackendState
from kvstack.router.scheduling.model_routes import ModelRouter, UnservedTarget

__all__ = ["UnservedTargets"]

log = logging.getLogger(__name__)

_LISTED_MODELS = 8  # how many served names a warning shows


class UnservedTargets:
    def __init__(self, models: ModelRouter) -> None:
        self._models = models
        self._reported: dict[tuple[str, str], UnservedTarget] = {}  # (name, target) -> it
        self._waiting_logged = False

    def check(self, states: Sequence[BackendState]) -> list[UnservedTarget]:
        """Log the changes since the last check; the targets unserved now."""
        if not any(s.models for s in states):
            if not self._waiting_logged and (self._models.routes or self._models.aliases):
                log.warning(
                    "model targets cannot be checked yet: no backend has reported its models"
                )
                self._waiting_logged = True
            return []
        unserved = self._models.unserved(states)
        served = _served(states)
        now = {(t.name, t.target): t for t in unserved}
        for key, target in now.items():
            if key not in self._reported:
                log.warning("%s", self._describe(target, served))
        for key, target in self._reported.items():
            if key not in now:
                kind = self._kind(target)
                log.info("model %s %r: target %r is served now", kind, *key)
        self._reported = now
        return unserved

    def _kind(self, target: UnservedTarget) -> str:
        return "route" if target.name in self._models.routes else "alias"

    def _describe(self, target: UnservedTarget, served: list[str]) -> str:
        shown = ", ".join(served[:_LISTED_MODELS]) + (", …" if len(served) > _LISTED_MODELS else "")
        if target.fallback:
            effect = "its share goes to the route's other targets"
        else:
            effect = f"requests for {target.name!r} fail and it is not in /v1/models"
        return (
            f"model {self._kind(target)} {target.name!r}: target {target.target!r} is served by "
            f"no backend (they serve: {shown}); {effect} until a backend serves it"
        )


def _served(states: Sequence[BackendState]) -> list[str]:
    return sorted(set().union(*(s.models for s in states)))
