"""``EndpointPicker``: the router's own decision, made for a request Envoy carries.

Nothing here decides: every step is the router's object, called as the router's proxy calls it
(:mod:`kvstack.router.proxy`) — parse (``http.parse``), API keys (``router.auth``), model
routes and the adapter registry (``router.resolve_target``), admission (``scheduler.admit``:
priorities, queues, shedding), the prompt's tokens and index lookups (``scheduler.prepare``),
the pipeline (``scheduler.decide``), the attempt steps (``router.proxy.steps``: the adapter
made hot on the chosen engine, the remote prefill) and the load lease and observers
(:class:`~kvstack.router.inflight.InFlight`). What is the EPP's own: the subset hint becomes
the ``exclude`` set of the decision, the InferenceObjective named by the request header sets
its priority, and the answer is an endpoint plus header and body changes instead of a relay.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kvstack.errors import NoBackendError, RequestError
from kvstack.router.attempt import Attempt
from kvstack.router.epp.config import EppConfig
from kvstack.router.epp.objectives import ObjectiveBook
from kvstack.router.epp.protocol import endpoint_of
from kvstack.router.fleet.backends import BackendState
from kvstack.router.http.parse import parse_request
from kvstack.router.http.responses import RawHeaders
from kvstack.router.inflight import InFlight
from kvstack.router.proxy import TENANT_HEADER
from kvstack.router.request import Endpoint, RoutingRequest, encode_body
from kvstack.router.router import Router
from kvstack.router.scheduling.pipeline import eligible_backends
from kvstack.router.tenancy import Tenancy

__all__ = ["EndpointPicker", "Placement"]

_ENDPOINTS: Mapping[str, Endpoint] = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
}
# Headers the router itself sets or drops on the way to a backend (Proxy.upstream_headers).
_MANAGED = ("authorization", "x-request-id", TENANT_HEADER)


@dataclass(slots=True, eq=False)
class Placement:
    """Where one request goes and what changes on the way; ``flight`` follows the answer."""

    endpoint: str  # ip:port
    backend: BackendState
    body: bytes  # what the backend gets
    rewritten: bool  # body differs from the client's (model, salt, dropped engine controls)
    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: list[str] = field(default_factory=list)
    response_headers: RawHeaders = field(default_factory=list)  # added to the client's answer
    request: RoutingRequest | None = None  # None: a request routing does not follow
    flight: InFlight | None = None

    def close(self) -> None:
        """The request ended: release its admission permit and adapter holds."""
        if self.request is not None:
            self.request.state.release()


class EndpointPicker:
    """``objectives``: priorities by InferenceObjective and InferenceModel (Kubernetes)."""

    def __init__(
        self, router: Router, config: EppConfig, objectives: ObjectiveBook | None = None
    ) -> None:
        self.router = router
        self.config = config
        self.objectives = objectives or ObjectiveBook()
        self._limit = router.config.limits.max_request_bytes

    @property
    def limit_bytes(self) -> int:
        return self._limit

    async def place(
        self,
        headers: Mapping[str, str],
        body: bytes,
        subset: Sequence[str] | None,
        arrival_s: float,
    ) -> Placement:
        """Choose the endpoint for one request (RequestError, NoBackendError say why not)."""
        exclude = self._outside(subset)
        endpoint = _ENDPOINTS.get(headers.get(":path", "").partition("?")[0])
        if endpoint is None:
            return self._passthrough(headers, body, exclude)
        router = self.router
        tenant = router.auth.tenant(headers)
        request = parse_request(
            endpoint, body, headers,
            session_header=router.config.session_header, tenant=tenant, arrival_s=arrival_s,
            tenancy=router.tenancy,  # the tenant's salt, its priority cap, privilege
        )  # fmt: skip
        request = self._with_priority(request, headers)
        forwarded = Tenancy.forwarded_body(request, body)  # a tenant's salt: a body mutation
        request, upstream_body = router.resolve_target(request, forwarded)
        scheduler = router.scheduler
        try:
            await scheduler.admit(request)
            await scheduler.prepare(request)
            decision = scheduler.decide(request, exclude)
            attempt = Attempt(1, decision, upstream_body, router.proxy.upstream_headers(request))
            router.telemetry.decision(decision.reason)
            for step in router.proxy.steps:  # the adapter made hot there; the remote prefill
                await step.before_attempt(request, attempt)
        except BaseException:
            request.state.release()
            raise
        backend = decision.backend
        placement = Placement(
            endpoint_of(backend.url),
            backend,
            attempt.body,
            attempt.body != body,
            response_headers=router.proxy.answer_headers(request, backend.id, attempt),
            request=request,
        )
        self._header_changes(placement, headers, attempt.headers)
        placement.flight = InFlight(request, backend, scheduler.observers)
        return placement

    def place_bodyless(self, headers: Mapping[str, str], subset: Sequence[str] | None) -> Placement:
        """A request without a body (``GET /v1/models``): any reachable endpoint, as GIE's
        EPP does; routing does not follow it."""
        return self._passthrough(headers, b"", self._outside(subset))

    # -- helpers ---------------------------------------------------------------------------
    def _outside(self, subset: Sequence[str] | None) -> Collection[str]:
        """Backend ids the subset hint leaves out (none without a hint)."""
        if subset is None:
            return ()
        if not subset:
            raise NoBackendError("the proxy's endpoint subset hint is empty")
        allowed = set(subset)
        states = self.router.pool.states()
        outside = {s.id for s in states if endpoint_of(s.url) not in allowed}
        if len(outside) == len(states):
            raise NoBackendError(f"no endpoint of the pool is in the subset hint {sorted(allowed)}")
        return outside

    def _with_priority(self, request: RoutingRequest, headers: Mapping[str, str]) -> RoutingRequest:
        """The objective's priority, unless the request names its own (x-kvstack-priority)."""
        if request.priority is not None:
            return request
        priority = self.objectives.priority(
            headers.get(self.config.objective_header), request.model
        )
        return request if priority is None else dataclasses.replace(request, priority=priority)

    @staticmethod
    def _header_changes(
        placement: Placement, incoming: Mapping[str, str], wanted: Mapping[str, str]
    ) -> None:
        """What the router would send differently from what the client sent (its API key
        replaced, request id and tenant set) becomes header mutations."""
        for key in _MANAGED:
            value = wanted.get(key)
            if value is None:
                if key in incoming:
                    placement.remove_headers.append(key)
            elif incoming.get(key) != value:
                placement.set_headers[key] = value
        if placement.rewritten:
            placement.set_headers["content-length"] = str(len(placement.body))

    def _passthrough(
        self, headers: Mapping[str, str], body: bytes, exclude: Collection[str]
    ) -> Placement:
        """Paths routing does not score: a reachable backend serving the body's model (any,
        without one), chosen at random; a caller's ``kv_transfer_params`` are dropped as on
        the scored paths (:meth:`Tenancy.engine_fields`)."""
        states = self.router.pool.states()
        decoded = _decoded(body)
        rewritten = False
        if decoded is not None:
            kept = self.router.tenancy.engine_fields(decoded, headers)
            if kept is not decoded:  # the caller's kv_transfer_params were dropped
                body, rewritten = encode_body(kept), True
        model = _model_of(decoded)
        if model is not None:
            candidates = eligible_backends(states, model, exclude)
        else:
            candidates = [s for s in states if s.reachable and s.id not in exclude]
        if not candidates:
            raise NoBackendError("no reachable backend for this request")
        backend = self.router.context.rng.choice(candidates)
        placement = Placement(endpoint_of(backend.url), backend, body, rewritten)
        if rewritten:
            placement.set_headers["content-length"] = str(len(body))
        return placement


def _decoded(body: bytes) -> dict[str, Any] | None:
    """A JSON object body, decoded (None: no body, or not an object)."""
    if not body:
        return None
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise RequestError("We could not parse the JSON body of your request") from None
    return decoded if isinstance(decoded, dict) else None


def _model_of(decoded: dict[str, Any] | None) -> str | None:
    model = None if decoded is None else decoded.get("model")
    return model if isinstance(model, str) and model else None


def arrival_now() -> float:
    """The clock the router's requests use for arrival (``time.perf_counter``)."""
    return time.perf_counter()
