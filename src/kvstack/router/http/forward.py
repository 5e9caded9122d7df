"""``Forwarder``: one proxied request, whatever its route, from the client's bytes to the answer.

Per request: authenticate (the API key names the tenant), read the body within the size limit,
parse what routing needs for the route's kind (:mod:`kvstack.router.http.routes`), resolve the
model, pin the request to a backend where only one can answer (a stored response, the
response it continues), forward (admission, decision, attempts, retries, streaming:
:class:`kvstack.router.proxy.Proxy`), then remember the id of a Responses API answer.
Every error the router makes is vLLM's error shape (:mod:`kvstack.router.http.responses`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from urllib.parse import parse_qs

from kvstack.errors import NoBackendError, RequestError, UpstreamError
from kvstack.router.http.parse import new_request_id, parse_form_request, parse_request
from kvstack.router.http.response_ids import ResponseLedger
from kvstack.router.http.responses import (
    Receive,
    Scope,
    Send,
    header_dict,
    read_body,
    send_bytes,
    send_error,
)
from kvstack.router.http.routes import RouteMatch
from kvstack.router.request import PRIORITY_HEADER, RoutingRequest
from kvstack.router.router import Router
from kvstack.router.tenancy import Tenancy
from kvstack.router.upstream.relay import Exchange, RetryableStatus

__all__ = ["CLIENT_CLOSED", "Forwarder"]

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's convention for "the client went away"
_watchers: set[asyncio.Task[None]] = set()  # strong references to pending watchers
_TRUE = frozenset({"1", "true", "yes", "on", "t", "y"})


class Forwarder:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.ledger = ResponseLedger(router.config.limits.stored_response_ids)
        self._limit = router.config.limits.max_request_bytes
        self._session_header = router.config.session_header
        self._turn = itertools.count()

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, found: RouteMatch | None
    ) -> None:
        """Answer one request; ``found`` is None for a path that is not one of vLLM's."""
        arrival_s = time.perf_counter()
        exchange = Exchange()
        model, status = "unknown", 500
        try:
            request, body = await self._request(scope, receive, found, arrival_s)
            model = request.model
            await self._forward(request, body, receive, send, exchange)
            status = exchange.status
            self._remember(request, exchange)
        except ConnectionResetError:
            status = CLIENT_CLOSED
        except RequestError as exc:
            status = exc.status
            await send_error(send, exc, exchange.extra_headers)
        except NoBackendError as exc:
            status = 503
            await send_error(send, RequestError(str(exc), 503, code="no_backend"))
        except RetryableStatus as exc:  # no retry left: relay the backend's own answer
            status = exc.status
            await send_bytes(send, exc.status, exc.body, b"application/json", exc.headers)
        except UpstreamError as exc:
            status = exc.status
            error = RequestError(str(exc), exc.status, code=exc.kind)
            await send_error(send, error, exchange.extra_headers)
        finally:
            self._observe(model, status, exchange, arrival_s)

    async def _request(
        self, scope: Scope, receive: Receive, found: RouteMatch | None, arrival_s: float
    ) -> tuple[RoutingRequest, bytes]:
        headers = header_dict(scope["headers"])
        tenant = self.router.auth.tenant(headers)
        raw = await read_body(receive, self._limit, headers.get("content-length"))
        path = _full_path(scope)
        kind = "model" if found is None else found.route.kind
        if found is not None and kind == "stored":
            return self._stored(scope, found, headers, tenant, arrival_s), raw
        if kind == "any":
            return self._any(scope, headers, tenant, arrival_s), raw
        request = self._parse(found, raw, headers, tenant, arrival_s, path)
        if scope["method"] != "POST":
            request = dataclasses.replace(request, method=scope["method"])
        request, raw = self.router.resolve_target(request, Tenancy.forwarded_body(request, raw))
        return self._continued(request), raw

    def _parse(
        self,
        found: RouteMatch | None,
        raw: bytes,
        headers: dict[str, str],
        tenant: str | None,
        arrival_s: float,
        path: str,
    ) -> RoutingRequest:
        common = {"session_header": self._session_header, "tenant": tenant,
                  "arrival_s": arrival_s, "route_path": path,
                  "tenancy": self.router.tenancy}  # fmt: skip
        if found is not None and found.route.kind == "form":
            return parse_form_request(raw, headers, **common)  # type: ignore[arg-type]
        endpoint = "other" if found is None else found.route.endpoint
        try:
            return parse_request(endpoint, raw, headers, **common)  # type: ignore[arg-type]
        except RequestError as exc:
            if found is not None:
                raise
            raise RequestError(  # not a vLLM route, and nothing to route it by
                f"unknown path {path.partition('?')[0]}: not a route of vLLM's API, and no "
                f"model in the body to forward it by ({exc.message})",
                404, code="unknown_path",
            ) from None  # fmt: skip

    def _stored(
        self,
        scope: Scope,
        found: RouteMatch,
        headers: dict[str, str],
        tenant: str | None,
        arrival_s: float,
    ) -> RoutingRequest:
        """A stored response's route: to the backend holding it (the tenant's own only)."""
        response_id = found.params["response_id"]
        stored = self.ledger.find(response_id)
        if stored is None or stored.tenant != tenant:
            raise RequestError(
                f"Response with id '{response_id}' not found.", 404, param="response_id",
                code="unknown_response", kind="invalid_request_error",
            )  # fmt: skip
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return RoutingRequest(
            request_id=new_request_id(headers), endpoint="other", model=stored.model,
            target=stored.model, stream=query.get("stream", ["false"])[-1].lower() in _TRUE,
            priority=self.router.tenancy.capped_priority(tenant, headers.get(PRIORITY_HEADER)),
            tenant=tenant, headers=headers,
            arrival_s=arrival_s, method=scope["method"], route_path=_full_path(scope),
            pinned_backend=stored.backend_id,
        )  # fmt: skip

    def _any(
        self, scope: Scope, headers: dict[str, str], tenant: str | None, arrival_s: float
    ) -> RoutingRequest:
        """A model-less route every engine answers alike: a usable backend, in turn."""
        states = [s for s in self.router.pool.states() if s.reachable and s.models]
        if not states:
            raise NoBackendError("no usable backend is serving a model")
        state = states[next(self._turn) % len(states)]
        target = min(state.models)
        return RoutingRequest(
            request_id=new_request_id(headers), endpoint="other", model=target, target=target,
            tenant=tenant, headers=headers, arrival_s=arrival_s, method=scope["method"],
            route_path=_full_path(scope), pinned_backend=state.id,
        )  # fmt: skip

    def _continued(self, request: RoutingRequest) -> RoutingRequest:
        """A response continuing a stored one goes where that one is stored."""
        if request.endpoint != "responses":
            return request
        previous = request.body.get("previous_response_id")
        stored = self.ledger.find(previous) if isinstance(previous, str) else None
        if stored is None or stored.tenant != request.tenant:
            return request  # unknown here: the engine answers (vLLM's 404)
        return dataclasses.replace(request, pinned_backend=stored.backend_id)

    def _remember(self, request: RoutingRequest, exchange: Exchange) -> None:
        answer = request.state.answer
        if request.endpoint == "responses" and exchange.status == 200 and answer is not None:
            self.ledger.remember(answer.first_bytes, answer.backend_id, request.target,
                                 request.tenant)  # fmt: skip

    async def _forward(
        self, request: RoutingRequest, body: bytes, receive: Receive, send: Send, ex: Exchange
    ) -> None:
        """Proxy, and cancel the upstream request if the client disconnects meanwhile.

        The watcher is never cancelled (cancelling a task costs ~30 µs, a third of the whole
        request): once the response is complete uvicorn's ``receive`` returns at once, and the
        watcher, seeing ``finished``, simply ends."""
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(_watch_disconnect(receive, task, ex))
        _watchers.add(watcher)
        watcher.add_done_callback(_watchers.discard)
        try:
            await self.router.proxy.forward(request, body, send, ex)
        except asyncio.CancelledError:
            if not ex.client_gone:
                raise
            task.uncancel()  # our own cancel: the request ends here, the server goes on
            self.router.telemetry.disconnect()
            ex.status = CLIENT_CLOSED
        finally:
            ex.finished = True

    def _observe(self, model: str, status: int, ex: Exchange, arrival_s: float) -> None:
        telemetry = self.router.telemetry
        telemetry.request(model, ex.backend, status, time.perf_counter() - arrival_s)
        if ex.client_first_byte_s and ex.upstream_sent_s:
            added = (ex.upstream_sent_s - arrival_s) + (
                ex.client_first_byte_s - ex.upstream_first_byte_s
            )
            telemetry.added_latency(added)
            if ex.streamed:
                telemetry.ttft(model, ex.client_first_byte_s - arrival_s)


def _full_path(scope: Scope) -> str:
    path: str = scope["path"]
    query: bytes = scope.get("query_string", b"")
    return path + ("?" + query.decode("latin-1") if query else "")


async def _watch_disconnect(receive: Receive, task: asyncio.Task[object], ex: Exchange) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if not ex.finished:
        ex.client_gone = True
        task.cancel()
