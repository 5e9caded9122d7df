"""The router's HTTP front end: a bare ASGI application served by uvicorn.

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (proxied, streaming or
not), ``GET /v1/models``, ``GET /health`` (503 when no backend is usable) and ``GET /metrics``;
with the adapter control plane and an admin key, its admin API under ``/admin/lora/``.

Why this HTTP stack (measured, not guessed) — on the 2-core development machine, ``wrk``
(1 thread) driving a minimal JSON-forwarding proxy in front of the trivial upstream of
``kvstack bench router``, all three sharing the two cores (req/s at 8 / 64 connections):

- bare ASGI callable on uvicorn (httptools, uvloop) + aiohttp client: 7,000 / 6,960
- Starlette on the same uvicorn + aiohttp client: 4,900 / 4,670
- aiohttp.web server + aiohttp client: 5,270 / 5,530
- bare ASGI on uvicorn + httpx AsyncClient: 37 / 29 (with timeouts; one sequential POST took
  ~1.7 ms against aiohttp's ~0.17 ms)

So uvicorn with httptools and uvloop runs a hand-routed ASGI callable (Starlette's request
objects and routing cost ~30%). For the upstream side, CPU per request decided: aiohttp's
client spent ~110 µs per POST and answer, a bare ``asyncio.Protocol`` with httptools ~8 µs
(:mod:`kvstack.router.upstream.connection`), so proxied requests use that lean client; the
control plane's few requests (health, models, metrics) use httpx, the one client library of the
process (:mod:`kvstack.router.upstream.control`). JSON is parsed with msgspec. Where the rest
goes (py-spy and in-process measurement): socket writes and reads (the kernel's loopback TCP),
uvicorn's own ~30 µs, and ~50 µs of the router's logic (parsing, pipeline, accounting, metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from kvstack.errors import NoBackendError, RequestError, UpstreamError
from kvstack.router.http.parse import parse_request
from kvstack.router.http.responses import (
    Receive,
    Scope,
    Send,
    header_dict,
    read_body,
    send_bytes,
    send_error,
    send_json,
)
from kvstack.router.request import Endpoint, RoutingRequest
from kvstack.router.router import Router
from kvstack.router.tenancy import Tenancy
from kvstack.router.upstream.relay import Exchange, RetryableStatus

__all__ = ["RouterApp"]

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's convention for "the client went away"
_watchers: set[asyncio.Task[None]] = set()  # strong references to pending watchers


class RouterApp:
    """``RouterApp(router)`` is an ASGI application; lifespan starts and closes the router."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._limit = router.config.limits.max_request_bytes
        self._session_header = router.config.session_header
        self._admin_path = router.config.adapters.admin_path + "/"
        self._admin = router.admin_app  # the adapter admin API, when there is an admin key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                await _method_not_allowed(send, "POST")
                return
            endpoint: Endpoint = "completions" if path == "/v1/completions" else "chat"
            await self._completion(scope, receive, send, endpoint)
            return
        if self._admin is not None and path.startswith(self._admin_path):
            prefix = self._admin_path[:-1]
            root = scope.get("root_path", "") + prefix
            await self._admin(
                {**scope, "path": path[len(prefix) :], "root_path": root}, receive, send
            )
            return
        handlers = {"/health": self._health, "/metrics": self._metrics, "/v1/models": self._models}
        handler = handlers.get(path)
        if handler is None:
            message = f"unknown path {path}; the router serves {', '.join(sorted(handlers))}, "
            message += "/v1/completions and /v1/chat/completions"
            await send_error(send, RequestError(message, 404, code="not_found"))
        elif method not in ("GET", "HEAD"):
            await _method_not_allowed(send, "GET")
        else:
            await handler(scope, send)

    async def _completion(
        self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint
    ) -> None:
        arrival_s = time.perf_counter()
        exchange = Exchange()
        model, status = "unknown", 500
        try:
            request, body = await self._parse(scope, receive, endpoint, arrival_s)
            model = request.model
            await self._forward(request, body, receive, send, exchange)
            status = exchange.status
        except ConnectionResetError:
            status = CLIENT_CLOSED
        except RequestError as exc:
            status = exc.status
            await send_error(send, exc)
        except NoBackendError as exc:
            status = 503
            error = RequestError(str(exc), 503, code="no_backend", kind="service_unavailable")
            await send_error(send, error, exchange.extra_headers)
        except RetryableStatus as exc:  # no retry left: relay the backend's own answer
            status = exc.status
            await send_bytes(send, exc.status, exc.body, b"application/json", exc.headers)
        except UpstreamError as exc:
            status = exc.status
            error = RequestError(str(exc), exc.status, code=exc.kind, kind="upstream_error")
            await send_error(send, error, exchange.extra_headers)
        finally:
            self._observe(model, status, exchange, arrival_s)

    async def _parse(
        self, scope: Scope, receive: Receive, endpoint: Endpoint, arrival_s: float
    ) -> tuple[RoutingRequest, bytes]:
        headers = header_dict(scope["headers"])
        tenant = self.router.auth.tenant(headers)
        body = await read_body(receive, self._limit, headers.get("content-length"))
        request = parse_request(
            endpoint,
            body,
            headers,
            session_header=self._session_header,
            tenant=tenant,
            arrival_s=arrival_s,
            tenancy=self.router.tenancy,  # the tenant's salt, its priority cap, privilege
        )
        return self.router.resolve_target(request, Tenancy.forwarded_body(request, body))

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

    async def _health(self, scope: Scope, send: Send) -> None:
        ok, report = self.router.health_report()
        await send_json(send, 200 if ok else 503, report)

    async def _metrics(self, scope: Scope, send: Send) -> None:
        self.router.telemetry.refresh_backends(self.router.pool.states())
        await send_bytes(send, 200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST.encode())

    async def _models(self, scope: Scope, send: Send) -> None:
        try:
            tenant = self.router.auth.tenant(header_dict(scope["headers"]))
        except RequestError as exc:
            await send_error(send, exc)
            return
        await send_json(send, 200, self.router.models_payload(tenant))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.router.start()
                except Exception as exc:  # the process boundary: report and let uvicorn exit
                    log.exception("router failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.router.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _watch_disconnect(receive: Receive, task: asyncio.Task[object], ex: Exchange) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if not ex.finished:
        ex.client_gone = True
        task.cancel()


async def _method_not_allowed(send: Send, allowed: str) -> None:
    error = RequestError(f"method not allowed; use {allowed}", 405, code="method_not_allowed")
    await send_error(send, error, [(b"allow", allowed.encode())])
