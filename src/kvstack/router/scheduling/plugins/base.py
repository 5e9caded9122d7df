"""The plugin interfaces of the scheduling pipeline: filters → weighted scorers → picker.

Call order per routing decision (see :class:`kvstack.router.scheduling.pipeline.Pipeline`)::

    candidates = usable backends serving request.target, minus those already tried
    for f in filters:  candidates = f.filter(request, candidates)     # may only remove
    for s in scorers:  result = s.score(request, candidates)          # each score in [0, 1]
    total[b] = Σ weight_s · result_s.scores.get(b.id, 0)
    chosen = picker.pick(request, ranked candidates)

Plugins are constructed once per router from config as ``cls(context, **args)``, run on the
event loop and must not block. A plugin that needs to learn from traffic (a prefix index, a
cost model) also implements :class:`RequestObserver`; one that needs background work (an event
subscription) overrides :meth:`Plugin.start` / :meth:`Plugin.close`. New policies are new
plugin files registered in :mod:`kvstack.router.scheduling.plugins`, never pipeline changes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from kvstack.router.fleet.backends import BackendView
from kvstack.router.request import RoutingRequest

if TYPE_CHECKING:
    from kvstack.router.config import RouterConfig
    from kvstack.router.fleet.backends import BackendPool

__all__ = [
    "Candidate",
    "Filter",
    "LazyNotes",
    "Picker",
    "Plugin",
    "PluginContext",
    "RequestObserver",
    "RequestPreparer",
    "ScoreResult",
    "Scorer",
]


@dataclass
class PluginContext:
    """What every plugin may use: a seeded RNG, named shared services (the prefix state, the
    cost model) that plugins create on first use and share (see
    :mod:`kvstack.router.scheduling.services`; the router starts and closes them), and, in a
    router, its config and backend pool."""

    rng: random.Random = field(default_factory=random.Random)
    services: dict[str, Any] = field(default_factory=dict)
    config: RouterConfig | None = None
    pool: BackendPool | None = None


class Plugin:
    """Base of filters, scorers and pickers: a registered name and an optional lifecycle."""

    name: ClassVar[str] = ""

    def __init__(self, context: PluginContext) -> None:
        self.context = context

    async def start(self) -> None:
        """Start background work (called once, before the first request)."""

    async def close(self) -> None:
        """Stop background work."""


class Filter(Plugin):
    def filter(self, request: RoutingRequest, backends: Sequence[BackendView]) -> list[BackendView]:
        """Return the backends that may serve ``request`` (a subset, order kept). Pure; may
        raise NoBackendError to say why none may."""
        raise NotImplementedError


class ScoreResult(NamedTuple):
    scores: Mapping[str, float]  # backend id -> [0, 1]; a missing id scores 0
    note: str = ""  # why, for the decision header ("pinned", "yield:saturated")
    details: Mapping[str, str] = {}  # backend id -> why (a prediction): the chosen one's is shown


class LazyNotes(Mapping[str, str]):
    """``ScoreResult.details`` formatted on demand (the header shows one backend's)."""

    __slots__ = ("_format", "_keys")

    def __init__(self, format_note: Callable[[str], str], keys: Mapping[str, object]) -> None:
        self._format = format_note
        self._keys = keys

    def __getitem__(self, backend_id: str) -> str:
        if backend_id not in self._keys:
            raise KeyError(backend_id)
        return self._format(backend_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class Scorer(Plugin):
    def score(self, request: RoutingRequest, backends: Sequence[BackendView]) -> ScoreResult:
        """Score each backend in [0, 1] (higher is better). Must not mutate router state."""
        raise NotImplementedError


class Candidate(NamedTuple):
    backend: BackendView
    score: float  # Σ weight · score over the scorers


class Picker(Plugin):
    #: The reason recorded when the scores tie and the picker alone decides.
    tie_reason: ClassVar[str] = "tie"

    def pick(self, request: RoutingRequest, candidates: Sequence[Candidate]) -> Candidate:
        """Choose one of ``candidates`` (never empty, best score first)."""
        raise NotImplementedError


@runtime_checkable
class RequestObserver(Protocol):
    """Optional: plugins that learn from outcomes. Called on the event loop; must not block."""

    def on_dispatch(self, request: RoutingRequest, backend: BackendView) -> None: ...

    def on_first_token(
        self, request: RoutingRequest, backend: BackendView, ttft_s: float
    ) -> None: ...

    def on_finish(self, request: RoutingRequest, backend: BackendView, outcome: str) -> None: ...


@runtime_checkable
class RequestPreparer(Protocol):
    """Optional, for services: async work per request after admission and before the
    pipeline runs (tokenizing on a worker thread, an index lookup), results in
    ``request.state``. Must not raise for a request's content; bounded in time."""

    async def prepare(self, request: RoutingRequest) -> None: ...
