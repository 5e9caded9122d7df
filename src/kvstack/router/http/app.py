"""The router's HTTP front end: a bare ASGI application served by uvicorn.

Every route of vLLM's OpenAI-compatible server (:mod:`kvstack.router.http.routes`): the
forwarded ones through :class:`~kvstack.router.http.forward.Forwarder` (streaming or not),
``GET /v1/models``, ``GET /health`` and ``/ping`` (503 when no backend is usable) and
``GET /metrics`` answered here; with the adapter control plane and an admin key, its admin API
under ``/admin/lora/``. Errors are vLLM's ``ErrorResponse``.

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

import logging

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from kvstack.errors import RequestError
from kvstack.router.http.forward import Forwarder
from kvstack.router.http.responses import (
    Receive,
    Scope,
    Send,
    header_dict,
    send_bytes,
    send_error,
    send_json,
)
from kvstack.router.http.routes import Route, match_route
from kvstack.router.router import Router

__all__ = ["RouterApp"]

log = logging.getLogger(__name__)


class RouterApp:
    """``RouterApp(router)`` is an ASGI application; lifespan starts and closes the router."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.forwarder = Forwarder(router)
        self._admin_path = router.config.adapters.admin_path + "/"
        self._admin = router.admin_app  # the adapter admin API, when there is an admin key
        self._local = {
            "/health": self._health,
            "/ping": self._health,
            "/metrics": self._metrics,
            "/v1/models": self._models,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if self._admin is not None and path.startswith(self._admin_path):
            prefix = self._admin_path[:-1]
            root = scope.get("root_path", "") + prefix
            await self._admin(
                {**scope, "path": path[len(prefix) :], "root_path": root}, receive, send
            )
            return
        found = match_route(path)
        if found is None:  # not one of vLLM's routes: forwarded by the body's model, or 404
            await self.forwarder.serve(scope, receive, send, None)
            return
        route = found.route
        if method not in route.methods and not (method == "HEAD" and "GET" in route.methods):
            await _method_not_allowed(send, route)
        elif route.forwarded:
            await self.forwarder.serve(scope, receive, send, found)
        elif route.kind == "local":
            await self._local[route.path](scope, send)
        else:
            await send_error(send, _engine_only(route, method))

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


def _engine_only(route: Route, method: str) -> RequestError:
    return RequestError(
        f"{method} {route.path} acts on one engine, and the router does not choose one for "
        "it: send it to that engine directly",
        404,
        code="engine_route",
    )


async def _method_not_allowed(send: Send, route: Route) -> None:
    allowed = ", ".join(route.methods)
    error = RequestError(
        f"method not allowed on {route.path}; use {allowed}", 405, code="method_not_allowed"
    )
    await send_error(send, error, [(b"allow", allowed.encode())])
