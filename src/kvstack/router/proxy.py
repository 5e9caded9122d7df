"""Forwarding with retries: admit, then decide → attempt → retry until an attempt answers.

Per request: the scheduler admits it (a queueing admission may hold it; the backend is chosen
only after) and prepares it (the prompt's tokens, index lookups). Per attempt: the scheduler
decides among the eligible backends not tried yet; the attempt steps shape the attempt (the
adapter stage loads the LoRA adapter there, prefill/decode prefills the prompt elsewhere on
the first attempt); the attempt is sent. A failure before the commit point (the first body
byte) backs off and tries another backend, within ``retry.max_attempts`` and the total
timeout; once bytes reached the client nothing is retried.

Per attempt the backend's load lease is taken at dispatch (so concurrent decisions see it),
its prefill share is returned at the first upstream byte, the request share when the attempt
ends however it ends (:class:`~kvstack.router.inflight.InFlight`, shared with the endpoint
picker). Failures feed passive ejection; a success clears it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

from kvstack.errors import NoBackendError, UpstreamError
from kvstack.router.attempt import Attempt, AttemptStep
from kvstack.router.config import RetryConfig, RouterConfig
from kvstack.router.fleet.backends import BackendState
from kvstack.router.http.responses import HOP_BY_HOP, RawHeaders, Send
from kvstack.router.inflight import InFlight
from kvstack.router.request import ADMIN_HEADER, REQUEST_ID_HEADER, RoutingRequest
from kvstack.router.scheduling.pipeline import RoutingDecision
from kvstack.router.scheduling.scheduler import RoutingScheduler
from kvstack.router.telemetry import Telemetry
from kvstack.router.upstream.pool import Deadline
from kvstack.router.upstream.relay import Exchange, Relay

__all__ = ["Proxy", "Retries"]

BACKEND_HEADER = b"x-kvstack-backend"
DECISION_HEADER = b"x-kvstack-decision"
TENANT_HEADER = "x-kvstack-tenant"


class Proxy:
    """``steps`` shape each attempt before it is sent, in order (:mod:`kvstack.router.attempt`)."""

    def __init__(
        self,
        config: RouterConfig,
        scheduler: RoutingScheduler,
        relay: Relay,
        telemetry: Telemetry,
        steps: Sequence[AttemptStep] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.relay = relay
        self.telemetry = telemetry
        self.steps = list(steps)
        self._rng = rng or random.Random()
        key = config.auth.upstream_api_key
        self._upstream_auth = None if key is None else f"Bearer {key.get_secret_value()}"
        self._drop_client_auth = config.auth.api_keys_file is not None or bool(config.auth.api_keys)

    async def forward(
        self, request: RoutingRequest, body: bytes, send: Send, exchange: Exchange
    ) -> None:
        """Answer ``request`` from some backend, or raise UpstreamError / NoBackendError
        (only ever before the commit point)."""
        await self.scheduler.admit(request)
        total = Deadline(self.config.timeouts.total_s, "total")
        try:
            await self.scheduler.prepare(request)
            await self._forward(request, body, send, exchange, total)
        finally:
            total.cancel()
            request.state.release()

    async def _forward(
        self, request: RoutingRequest, body: bytes, send: Send, exchange: Exchange, total: Deadline
    ) -> None:
        """Decide, attempt, retry: until an attempt answers or none is left."""
        headers = self.upstream_headers(request)
        retries = Retries(self.config.retry, total, self._rng)
        while (number := await retries.next()) is not None:
            decision = self._decide(request, retries)
            if decision is None:
                break
            try:
                attempt = Attempt(number, decision, body, headers)
                await self._attempt(request, attempt, send, exchange, total)
                return
            except UpstreamError as exc:
                self._failed(decision.backend, exc, retries)
        raise retries.last_failure()

    def _decide(self, request: RoutingRequest, retries: Retries) -> RoutingDecision | None:
        """The next attempt's backend; None when none is left after a failed attempt."""
        try:
            decision = self.scheduler.decide(request, retries.tried)
        except NoBackendError:
            if retries.failure is None:
                raise
            return None
        retries.tried.append(decision.backend.id)
        return decision

    async def _attempt(
        self,
        request: RoutingRequest,
        attempt: Attempt,
        send: Send,
        exchange: Exchange,
        total: Deadline,
    ) -> None:
        exchange.attempts = attempt.number
        self.telemetry.decision(attempt.decision.reason)
        for step in self.steps:  # the adapter load; the remote prefill (first attempt)
            await step.before_attempt(request, attempt)
        await self._send(request, attempt, send, exchange, total)

    async def _send(
        self,
        request: RoutingRequest,
        attempt: Attempt,
        send: Send,
        exchange: Exchange,
        total: Deadline,
    ) -> None:
        """Dispatch the attempt and relay its answer; observers see dispatch, first token and
        finish, the load lease follows them."""
        backend = attempt.backend
        exchange.backend = backend.id
        exchange.extra_headers = self._response_headers(request, backend.id, attempt)
        flight = InFlight(request, backend, self.scheduler.observers)
        outcome = "cancelled"
        try:
            exchange.upstream_sent_s = time.perf_counter()
            opened = await self.relay.open(
                backend.url, request.path, attempt.headers, attempt.body, backend.id,
                request.stream, total, request.method,
            )  # fmt: skip
            exchange.upstream_first_byte_s = time.perf_counter()
            flight.first_byte(opened.first, exchange.upstream_first_byte_s - request.arrival_s)
            outcome = await self.relay.deliver(opened, send, exchange, total)
            if outcome != "ok":
                self.telemetry.stream_abort(outcome)
        except UpstreamError as exc:
            outcome = exc.kind
            raise
        finally:
            flight.finish(outcome)

    def _failed(self, backend: BackendState, exc: UpstreamError, retries: Retries) -> None:
        if retries.failed(exc):
            self.telemetry.retry(exc.kind)
        self.telemetry.upstream_error(backend.id, exc.kind)
        backend.record_failure(self.config.ejection, exc.kind)

    def upstream_headers(self, request: RoutingRequest) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k not in HOP_BY_HOP}
        if self._drop_client_auth:
            headers.pop("authorization", None)
        headers.pop(ADMIN_HEADER, None)
        if self._upstream_auth is not None:
            headers["authorization"] = self._upstream_auth
        headers[REQUEST_ID_HEADER] = request.request_id
        if request.tenant is not None:  # set by the router only: a client cannot spoof it
            headers[TENANT_HEADER] = request.tenant
        else:
            headers.pop(TENANT_HEADER, None)
        headers.setdefault("content-type", "application/json")
        return headers

    def answer_headers(
        self, request: RoutingRequest, backend_id: str, attempt: Attempt
    ) -> RawHeaders:
        """The router's headers on the client's answer (the endpoint picker adds them too)."""
        return self._response_headers(request, backend_id, attempt)

    @staticmethod
    def _response_headers(request: RoutingRequest, backend_id: str, attempt: Attempt) -> RawHeaders:
        # Match counts and scores tell whether a prompt is cached: admin key or debug only.
        decision = (
            attempt.decision_header() if request.privileged else attempt.public_decision_header()
        )
        return [
            (BACKEND_HEADER, backend_id.encode("latin-1", "replace")),
            (DECISION_HEADER, decision.encode("latin-1", "replace")),
            (REQUEST_ID_HEADER.encode(), request.request_id.encode("latin-1", "replace")),
            *attempt.response_headers,
        ]


class Retries:
    """The attempts at one request: how many, the backoff before each retry, the total
    deadline, the backends tried and the last failure."""

    def __init__(self, config: RetryConfig, total: Deadline, rng: random.Random) -> None:
        self.config = config
        self.total = total
        self.tried: list[str] = []
        self.failure: UpstreamError | None = None
        self._rng = rng
        self._number = 0

    async def next(self) -> int | None:
        """The next attempt's number once its backoff has passed, None when none is left;
        UpstreamError (504) once the total timeout has passed."""
        if self._number >= self.config.max_attempts:
            return None
        if self._number:
            remaining_s = max(0.0, self.total.remaining_s())
            await asyncio.sleep(min(self._backoff_s(), remaining_s))
        if self.total.expired or self.total.remaining_s() <= 0:
            raise _total_timeout()
        self._number += 1
        return self._number

    def failed(self, exc: UpstreamError) -> bool:
        """Record a failed attempt; True when another may follow. Raises the total timeout
        instead when that is what ended the attempt."""
        if self.total.expired:
            raise _total_timeout() from None
        self.failure = exc
        return self._number < self.config.max_attempts

    def last_failure(self) -> UpstreamError:
        assert self.failure is not None, "no attempt failed"
        return self.failure

    def _backoff_s(self) -> float:
        delay = self.config.backoff_base_s * 2.0 ** (self._number - 1)
        delay = min(self.config.backoff_max_s, delay)
        return delay * (0.5 + 0.5 * self._rng.random())  # jitter: retries do not move in lockstep


def _total_timeout() -> UpstreamError:
    return UpstreamError("the request exceeded the total timeout", "timeout", 504)
