"""``InFlight``: one attempt's life on its backend, as routing learns from it.

The proxy and the endpoint picker (:mod:`kvstack.router.epp`) both send a request somewhere and
then hear how it went; this is the one place that turns those moments into routing state::

    flight = InFlight(request, backend, scheduler.observers)  # dispatch: load lease, observers
    flight.first_byte(first_bytes, ttft_s)                     # prefill share back, TTFT learnt
    flight.finish(outcome)                                     # request share back, observers

``finish`` runs once whatever ends the attempt ("ok", a failure kind, "cancelled"); a second
call does nothing, so every exit path may call it.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstack.router.fleet.backends import BackendState
from kvstack.router.request import AnswerStart, RoutingRequest
from kvstack.router.scheduling.plugins.base import RequestObserver

__all__ = ["InFlight"]


class InFlight:
    """Created at dispatch: takes the backend's load lease and tells the observers."""

    __slots__ = ("_finished", "_observers", "backend", "lease", "request")

    def __init__(
        self,
        request: RoutingRequest,
        backend: BackendState,
        observers: Sequence[RequestObserver],
    ) -> None:
        self.request = request
        self.backend = backend
        self._observers = observers
        self._finished = False
        self.lease = backend.load.acquire(request.prefill_tokens(backend.id))
        for observer in observers:
            observer.on_dispatch(request, backend)

    @property
    def started(self) -> bool:
        """Whether the first byte came."""
        return self.request.state.answer is not None

    def first_byte(self, first_bytes: bytes, ttft_s: float) -> None:
        """The backend's first body bytes arrived ``ttft_s`` after the request did."""
        request, backend = self.request, self.backend
        request.state.answer = AnswerStart(backend.id, first_bytes, ttft_s)
        self.lease.first_token()
        backend.ejection.record_success()
        for observer in self._observers:
            observer.on_first_token(request, backend, ttft_s)

    def finish(self, outcome: str) -> None:
        """The attempt ended with ``outcome`` ("ok", a failure kind or "cancelled")."""
        if self._finished:
            return
        self._finished = True
        self.lease.release()
        for observer in self._observers:
            observer.on_finish(self.request, self.backend, outcome)
