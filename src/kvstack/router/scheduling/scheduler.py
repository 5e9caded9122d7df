"""``RoutingScheduler``: what the proxy asks before each request and each attempt, and who
hears how they went.

Per request: ``admit`` (the admission plugin: hold or shed; the permit goes into the request's
state), ``prepare`` (services: the prompt's tokens on a worker thread, index lookups). Per
attempt: ``decide`` (eligible backends not tried yet, decode backends only for a
prefill/decode model, through the pipeline). ``observers`` are the plugins and services that
learn from dispatch, first token and finish; the proxy and the prefill step call each in turn.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvstack.errors import NoBackendError
from kvstack.router.admission.base import Admission
from kvstack.router.fleet.backends import BackendPool, BackendState
from kvstack.router.pd.plan import DECODE_ROLES
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.pipeline import Pipeline, RoutingDecision, eligible_backends
from kvstack.router.scheduling.plugins.base import RequestObserver, RequestPreparer

__all__ = ["RoutingScheduler"]


class RoutingScheduler:
    """``services``: shared objects the plugins created (prefix state, cost model, the LoRA
    control plane); those that prepare or observe requests take part."""

    def __init__(
        self,
        pool: BackendPool,
        pipeline: Pipeline,
        admission: Admission,
        services: Sequence[object] = (),
        decode_models: Collection[str] = (),
    ) -> None:
        self.pool = pool
        self.pipeline = pipeline
        self.admission = admission
        self.decode_models = frozenset(decode_models)
        members = [*services, admission, *pipeline.plugins()]
        self.observers = tuple(m for m in members if isinstance(m, RequestObserver))
        self.preparers = [s for s in services if isinstance(s, RequestPreparer)]

    async def admit(self, request: RoutingRequest) -> None:
        """Wait until ``request`` may go (its permit into its state), or raise RequestError."""
        request.state.permit = await self.admission.admit(request)

    async def prepare(self, request: RoutingRequest) -> None:
        """Late, right before the first decision: tokens and lookups for the dispatch now."""
        for preparer in self.preparers:
            await preparer.prepare(request)

    def eligible(
        self, request: RoutingRequest, exclude: Collection[str] = ()
    ) -> list[BackendState]:
        """Backends that may serve ``request.target`` now (see :func:`eligible_backends`)."""
        return eligible_backends(self.pool.states(), request.target, exclude)

    def decide(self, request: RoutingRequest, exclude: Collection[str] = ()) -> RoutingDecision:
        """The backend that answers the next attempt; NoBackendError says why there is none."""
        candidates = eligible_backends(self.pool.states(), request.target, exclude)
        if request.pinned_backend is not None:  # it holds the request's state (a response)
            candidates = [s for s in candidates if s.id == request.pinned_backend]
            if not candidates:
                raise NoBackendError(
                    f"backend {request.pinned_backend!r}, which holds this request's state, "
                    "cannot take it now"
                )
        if request.target in self.decode_models:
            candidates = [s for s in candidates if s.backend.role in DECODE_ROLES]
            if not candidates:
                raise NoBackendError(f"no decode backend serves the PD model {request.target!r}")
        return self.pipeline.decide(request, candidates)
