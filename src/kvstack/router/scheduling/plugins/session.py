"""Session affinity: the same session goes to the same backend while it is not saturated.

The session key is the ``x-session-id`` header (configurable), else the OpenAI ``user`` field.
The pinned backend is chosen by rendezvous (highest-random-weight) hashing over the candidates,
so adding or losing a backend moves only the sessions that must move. When the pinned backend
is saturated the scorer expresses no preference ("yield"), and the other scorers (least load)
decide.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from kvstack.metrics import counter
from kvstack.router.fleet.backends import BackendView
from kvstack.router.fleet.saturation import SaturationLimits
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import PluginContext, Scorer, ScoreResult

__all__ = ["SessionAffinityScorer", "rendezvous_rank"]

AFFINITY = counter(
    "kvstack_router_session_affinity_total",
    "Session affinity outcomes: pinned, yielded (pinned backend saturated), no_key",
    ["outcome"],
)


def rendezvous_rank(key: str, backends: Sequence[BackendView]) -> list[BackendView]:
    """Backends in ``key``'s preference order (stable under membership changes)."""
    return sorted(
        backends, key=lambda b: xxhash.xxh64_intdigest(f"{key}\0{b.id}".encode()), reverse=True
    )


class SessionAffinityScorer(Scorer):
    name = "session_affinity"

    def __init__(
        self,
        context: PluginContext,
        max_waiting: float | None = 5.0,
        max_kv_usage: float | None = 0.9,
        max_in_flight: int | None = None,
    ) -> None:
        super().__init__(context)
        self.limits = SaturationLimits(max_waiting, max_kv_usage, max_in_flight)
        self._outcomes = {o: AFFINITY.labels(o) for o in ("pinned", "yielded", "no_key")}

    def score(self, request: RoutingRequest, backends: Sequence[BackendView]) -> ScoreResult:
        key = request.session_id
        if not key:
            self._outcomes["no_key"].inc()
            return ScoreResult({}, "no_key")
        pinned = max(backends, key=lambda b: xxhash.xxh64_intdigest(f"{key}\0{b.id}".encode()))
        saturated = self.limits.reason(pinned)
        if saturated is not None:
            self._outcomes["yielded"].inc()
            return ScoreResult({}, f"yield:{saturated}")
        self._outcomes["pinned"].inc()
        return ScoreResult({pinned.id: 1.0}, "pinned")
