"""What the cache manager tells the router to do with one request.

``serve``: send the request to the engine with ``model`` = ``adapter_id@version`` (hot now).
``fallback``: send it with ``model`` = the engine's base model and add :meth:`headers` (the
tenant allows it and the adapter could not be made hot within the budget).
``reject``: answer 503 with ``Retry-After`` (or without, for a permanent failure).

The router calls :meth:`AdapterDecision.finish` exactly once when the request ends (any action): it
releases the adapter for eviction, records TTFT per adapter, cold or warm, and checks that the
engine answered with the version the request was routed with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["FALLBACK_HEADER", "Action", "AdapterDecision"]

FALLBACK_HEADER = "x-kvstack-adapter-fallback"

FinishFn = Callable[[float | None, bool, str | None], None]


class Action(str, Enum):
    SERVE = "serve"
    FALLBACK = "fallback"
    REJECT = "reject"


def _no_finish(_ttft_s: float | None, _ok: bool, _served: str | None) -> None:
    pass


@dataclass(slots=True)
class AdapterDecision:
    action: Action
    model: str  # what to put in the forwarded request's "model" field ("" for reject)
    engine_url: str
    adapter: str  # adapter_id@version the request resolved to
    start: str  # residency at arrival: hot, warm or cold
    reason: str = ""
    waited_s: float = 0.0  # time spent waiting for a load
    predicted_load_s: float = 0.0
    retry_after_s: float | None = None  # reject: when a retry may succeed; None: do not retry
    _finish: FinishFn = field(default=_no_finish, repr=False)
    _finished: bool = field(default=False, repr=False)

    @property
    def cold(self) -> bool:
        return self.start != "hot"

    def headers(self) -> dict[str, str]:
        """Response headers the router adds: the fallback marker or Retry-After."""
        if self.action is Action.FALLBACK:
            return {FALLBACK_HEADER: f"base; adapter={self.adapter}; reason={self.reason}"}
        if self.action is Action.REJECT and self.retry_after_s is not None:
            return {"retry-after": str(max(1, math.ceil(self.retry_after_s)))}
        return {}

    def finish(
        self, ttft_s: float | None = None, ok: bool = True, served_model: str | None = None
    ) -> None:
        """The request ended; ``served_model`` is the ``model`` field of the engine's answer."""
        if self._finished:
            return
        self._finished = True
        self._finish(ttft_s, ok, served_model)
