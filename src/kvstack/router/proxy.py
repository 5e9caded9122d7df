"""Forwarding with retries: admit, decide, account, attempt; on a failure before the commit
point, back off and try another backend (bounded attempts); never retry once bytes reached the
client.

Per attempt: the pipeline picks a backend among the eligible ones not tried yet; its load lease
is taken at once (so concurrent decisions see it), the prefill share is returned at the first
upstream byte, the request share when the attempt ends however it ends. Failures feed passive
ejection; a success clears it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from kvstack.errors import NoBackendError, UpstreamError
from kvstack.router.adapters import AdapterGate, served_model
from kvstack.router.admission.base import Admission, ImmediateAdmission
from kvstack.router.config import RouterConfig
from kvstack.router.fleet.backends import BackendPool, BackendState, BackendView
from kvstack.router.http.responses import HOP_BY_HOP, Send
from kvstack.router.pd.step import PrefillStep, decode_candidates
from kvstack.router.request import REQUEST_ID_HEADER, RoutingRequest
from kvstack.router.scheduling.pipeline import Pipeline, RoutingDecision, eligible_backends
from kvstack.router.scheduling.plugins.base import PluginContext, RequestObserver, RequestPreparer
from kvstack.router.telemetry import Telemetry
from kvstack.router.upstream.pool import Deadline, UpstreamPool
from kvstack.router.upstream.relay import Exchange, Relay

if TYPE_CHECKING:
    from kvstack.lora.decision import Decision as AdapterDecision

__all__ = ["PATHS", "Proxy", "observers_of"]

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
BACKEND_HEADER = b"x-kvstack-backend"
DECISION_HEADER = b"x-kvstack-decision"
TENANT_HEADER = "x-kvstack-tenant"


class Proxy:
    def __init__(
        self,
        config: RouterConfig,
        pool: BackendPool,
        pipeline: Pipeline,
        upstreams: UpstreamPool,
        telemetry: Telemetry,
        observers: Sequence[RequestObserver] = (),
        rng: random.Random | None = None,
        admission: Admission | None = None,
        preparers: Sequence[RequestPreparer] = (),
        adapters: AdapterGate | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.pipeline = pipeline
        self.telemetry = telemetry
        self.observers = list(observers)
        self.admission = admission or ImmediateAdmission(PluginContext())
        self.preparers = list(preparers)
        self.adapters = adapters
        self._rng = rng or random.Random()
        retry_statuses = frozenset(config.retry.on_status)
        self._relay = Relay(upstreams, config.timeouts.first_byte_s, retry_statuses)
        self.pd = (
            PrefillStep(config.pd, pipeline, self._relay, adapters) if config.pd.models else None
        )
        key = config.auth.upstream_api_key
        self._upstream_auth = None if key is None else f"Bearer {key.get_secret_value()}"
        self._drop_client_auth = config.auth.api_keys_file is not None or bool(config.auth.api_keys)

    async def forward(
        self, request: RoutingRequest, body: bytes, send: Send, exchange: Exchange
    ) -> None:
        """Answer ``request`` from some backend, or raise UpstreamError / NoBackendError
        (only ever before the commit point)."""
        permit = await self.admission.admit(request)
        total = Deadline(self.config.timeouts.total_s, "total")
        try:
            for preparer in self.preparers:  # late: tokens and lookups for the dispatch now
                await preparer.prepare(request)
            await self._forward(request, body, send, exchange, total)
        finally:
            total.cancel()
            permit.release()

    async def _forward(
        self,
        request: RoutingRequest,
        body: bytes,
        send: Send,
        exchange: Exchange,
        total: Deadline,
    ) -> None:
        headers = self.upstream_headers(request)
        tried: list[str] = []
        failure: UpstreamError | None = None
        for attempt in range(self.config.retry.max_attempts):
            if attempt:
                await asyncio.sleep(min(self._backoff_s(attempt), max(0.0, total.remaining_s())))
            if total.expired or total.remaining_s() <= 0:
                raise UpstreamError("the request exceeded the total timeout", "timeout", 504)
            try:
                everyone = eligible_backends(self.pool.states(), request.target, tried)
                decision = self._decide(request, everyone)
            except NoBackendError:
                if failure is None:
                    raise
                break
            tried.append(decision.backend.id)
            exchange.attempts = attempt + 1
            self.telemetry.decision(decision.reason)
            adapter: AdapterDecision | None = None
            sent, extra = body, list[tuple[bytes, bytes]]()
            if self.adapters is not None:  # load the LoRA adapter there first (budgets apply)
                adapter, sent, extra = await self.adapters.admit(request, decision.backend, body)
            if attempt == 0 and self.pd is not None and self.pd.applies(request):
                try:  # with the model the decode backend serves it with
                    decision = await self._prefill_remotely(
                        request, headers, everyone, decision, adapter
                    )
                except BaseException:
                    if adapter is not None:
                        adapter.finish(ok=False)
                    raise
            try:
                await self._attempt(
                    request, sent, headers, send, exchange, decision, total, adapter, extra
                )
                return
            except UpstreamError as exc:
                if total.expired:
                    raise UpstreamError(
                        "the request exceeded the total timeout", "timeout", 504
                    ) from None
                failure = exc
                self._record_failure(cast(BackendState, decision.backend), exc)
                if attempt + 1 < self.config.retry.max_attempts:
                    self.telemetry.retry(exc.kind)
        assert failure is not None
        raise failure

    def _decide(self, request: RoutingRequest, everyone: Sequence[BackendView]) -> RoutingDecision:
        candidates = list(everyone)
        if self.adapters is not None:
            candidates = self.adapters.candidates(request, candidates)
        if self.pd is not None and self.pd.applies(request):
            candidates = decode_candidates(candidates)
            if not candidates:
                raise NoBackendError(f"no decode backend serves the PD model {request.target!r}")
        return self.pipeline.decide(request, candidates)

    async def _prefill_remotely(
        self,
        request: RoutingRequest,
        headers: dict[str, str],
        everyone: Sequence[BackendView],
        decision: RoutingDecision,
        adapter: AdapterDecision | None,
    ) -> RoutingDecision:
        assert self.pd is not None
        uncached = prefill_tokens(request, decision.backend.id)
        outcome = await self.pd.run(
            request, PATHS[request.endpoint], headers, everyone, decision, uncached,
            self.observers, adapter,
        )  # fmt: skip
        return dataclasses.replace(decision, notes=(*decision.notes, outcome.note()))

    async def _attempt(
        self,
        request: RoutingRequest,
        body: bytes,
        headers: dict[str, str],
        send: Send,
        exchange: Exchange,
        decision: RoutingDecision,
        total: Deadline,
        adapter: AdapterDecision | None = None,
        extra_headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        state = cast(BackendState, decision.backend)
        lease = state.load.acquire(prefill_tokens(request, state.id))
        exchange.backend = state.id
        exchange.extra_headers = self._decision_headers(request, decision, exchange.attempts)
        exchange.extra_headers.extend(extra_headers)
        for observer in self.observers:
            observer.on_dispatch(request, state)
        outcome = "cancelled"
        answered_by: str | None = None
        try:
            exchange.upstream_sent_s = time.perf_counter()
            opened = await self._relay.open(
                state.url, PATHS[request.endpoint], headers, body, state.id, request.stream, total
            )
            exchange.upstream_first_byte_s = time.perf_counter()
            if adapter is not None:
                answered_by = served_model(opened.first)
            lease.first_token()
            state.ejection.record_success()
            for observer in self.observers:
                observer.on_first_token(
                    request, state, exchange.upstream_first_byte_s - request.arrival_s
                )
            outcome = await self._relay.deliver(opened, send, exchange, total)
            if outcome != "ok":
                self.telemetry.stream_abort(outcome)
        except UpstreamError as exc:
            outcome = exc.kind
            raise
        finally:
            lease.release()
            for observer in self.observers:
                observer.on_finish(request, state, outcome)
            if adapter is not None:
                first = exchange.upstream_first_byte_s
                ttft = first - request.arrival_s if request.stream and answered_by else None
                adapter.finish(ttft, outcome == "ok", answered_by)

    def upstream_headers(self, request: RoutingRequest) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k not in HOP_BY_HOP}
        if self._drop_client_auth:
            headers.pop("authorization", None)
        if self._upstream_auth is not None:
            headers["authorization"] = self._upstream_auth
        headers[REQUEST_ID_HEADER] = request.request_id
        if request.tenant is not None:  # set by the router only: a client cannot spoof it
            headers[TENANT_HEADER] = request.tenant
        else:
            headers.pop(TENANT_HEADER, None)
        headers.setdefault("content-type", "application/json")
        return headers

    @staticmethod
    def _decision_headers(
        request: RoutingRequest, decision: RoutingDecision, attempt: int
    ) -> list[tuple[bytes, bytes]]:
        value = decision.header() + (f";attempt={attempt}" if attempt > 1 else "")
        return [
            (BACKEND_HEADER, decision.backend.id.encode("latin-1", "replace")),
            (DECISION_HEADER, value.encode("latin-1", "replace")),
            (REQUEST_ID_HEADER.encode(), request.request_id.encode("latin-1", "replace")),
        ]

    def _record_failure(self, state: BackendState, exc: UpstreamError) -> None:
        self.telemetry.upstream_error(state.id, exc.kind)
        state.record_failure(self.config.ejection, exc.kind)

    def _backoff_s(self, attempt: int) -> float:
        retry = self.config.retry
        delay = min(retry.backoff_max_s, retry.backoff_base_s * 2.0 ** (attempt - 1))
        return delay * (0.5 + 0.5 * self._rng.random())  # jitter: retries do not move in lockstep


def prefill_tokens(request: RoutingRequest, backend_id: str) -> int:
    """The prompt tokens the backend must compute: the cost model's uncached estimate for it
    when one ran, else the whole prompt."""
    uncached = request.scratch.get("uncached_tokens")
    if uncached is not None and backend_id in uncached:
        return int(uncached[backend_id])
    return request.estimated_prompt_tokens


def observers_of(plugins: Sequence[object]) -> list[RequestObserver]:
    return [p for p in plugins if isinstance(p, RequestObserver)]
