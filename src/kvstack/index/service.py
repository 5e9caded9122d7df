"""The cluster KV index service: a Starlette app over :class:`~kvstack.index.state.IndexState`.

Routes (bodies are JSON, or msgpack with ``Content-Type: application/msgpack``; answers use the
request's format):

- ``POST /events`` — an engine's report (:class:`~kvstack.index.protocol.AnnounceBatch`).
- ``POST /lookup`` — per engine and per tier, the matched prefix of a prompt.
- ``POST /locate`` — which engines lend each chunk (used by ``peer://`` tiers).
- ``GET /instances``, ``GET /health``, ``GET /metrics``.

With ``index.service.zmq_port`` set, the same operations (``events``, ``lookup``, ``locate``) are
also answered over ZMQ (:mod:`kvstack.index.zmq_server`), on the same event loop.

With the cluster's keys every route but ``/health`` requires the members' bearer token (401
otherwise), and a report must carry its instance's announce token (403 otherwise): see
:mod:`kvstack.index.auth`. Bodies above ``max_body_bytes`` are refused (413) before they are
read whole; reports above ``max_report_keys``, locates above ``max_locate_keys`` and new
engines beyond ``max_instances`` are refused with a message naming the limit. Refusals are
counted in ``kvstack_index_refused_total{reason}``.

A background task expires silent engines and sweeps the index in bounded steps, yielding to
requests in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kvstack.index.auth import check_announce_token, check_bearer
from kvstack.index.config import IndexServiceConfig
from kvstack.index.operations import REFUSED, Operation, Refusal, count_request, refused
from kvstack.index.protocol import AnnounceBatch, LocateRequest, LookupRequest
from kvstack.index.state import IndexState
from kvstack.metrics import counter, gauge, histogram

if TYPE_CHECKING:
    from kvstack.index.zmq_server import ZmqServer
    from kvstack.security import ClusterKeys

__all__ = ["IndexService", "build_app"]

log = logging.getLogger(__name__)
M = TypeVar("M")
MSGPACK = "application/msgpack"
ROUTES = frozenset({"events", "lookup", "locate", "instances", "health", "metrics"})

_LOOKUP_S = histogram("kvstack_index_lookup_seconds", "Time to answer one lookup")
_EVENT_KEYS = counter("kvstack_index_event_keys_total", "Chunk keys reported", ["kind"])
_RESYNCS = counter("kvstack_index_resyncs_total", "Reports answered with resync")
_ENTRIES = gauge("kvstack_index_entries", "Chunk keys indexed")
_INSTANCES = gauge("kvstack_index_instances", "Engines known to the index")
_EXPIRED = counter("kvstack_index_expired_instances_total", "Engines forgotten after silence")


def _decode(request: Request, body: bytes, kind: type[M]) -> M:
    if request.headers.get("content-type", "").startswith(MSGPACK):
        return msgspec.msgpack.decode(body, type=kind)
    return msgspec.json.decode(body, type=kind)


def _encode(request: Request, value: Any) -> Response:
    if request.headers.get("content-type", "").startswith(MSGPACK):
        return Response(msgspec.msgpack.encode(value), media_type=MSGPACK)
    return Response(msgspec.json.encode(value), media_type="application/json")


def _handler(route: str, operation: Operation, max_body_bytes: int) -> Callable[[Request], Any]:
    async def handle(request: Request) -> Response:
        try:
            body = await _read_body(request, max_body_bytes)
            message = _decode(request, body, operation.kind)
            result = operation.answer(message)
        except Refusal as exc:
            refused(exc.reason)
            count_request(route, str(exc.status))
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except REFUSED as exc:
            refused("invalid")
            count_request(route, "400")
            return JSONResponse({"error": str(exc)}, status_code=400)
        count_request(route, "200")
        return _encode(request, result)

    return handle


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise _too_large(size, limit)
        parts.append(part)
    return b"".join(parts)


def _too_large(size: int, limit: int) -> Refusal:
    return Refusal(
        f"request body of {size}+ bytes exceeds index.service.max_body_bytes ({limit})", 413, "size"
    )


class BearerAuth:
    """ASGI middleware: every path but ``/health`` needs the members' bearer token."""

    OPEN = frozenset({"/health"})

    def __init__(self, app: ASGIApp, keys: ClusterKeys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        if check_bearer(self.keys, header):
            await self.app(scope, receive, send)
            return
        refused("auth")
        route = scope["path"].strip("/")  # a label: known routes only, never a caller's path
        count_request(route if route in ROUTES else "other", "401")
        message = "this index requires the cluster's bearer token (security.cluster_secret_file)"
        response = JSONResponse({"error": message}, status_code=401,
                                headers={"www-authenticate": "Bearer"})  # fmt: skip
        await response(scope, receive, send)


class IndexService:
    """The app's state and its maintenance loop."""

    def __init__(self, config: IndexServiceConfig, keys: ClusterKeys | None = None) -> None:
        self.config = config
        self.keys = keys
        self.state = IndexState(config.max_lookup_tokens)
        self.operations = {
            "events": Operation(AnnounceBatch, self.on_events),
            "lookup": Operation(LookupRequest, self.on_lookup),
            "locate": Operation(LocateRequest, self.on_locate),
        }

    def on_events(self, batch: AnnounceBatch) -> Any:
        self._check_report(batch)
        reply = self.state.apply(batch)
        if reply.resync:
            _RESYNCS.inc()
        else:
            _EVENT_KEYS.labels("stored").inc(sum(map(len, batch.stored.values())))
            _EVENT_KEYS.labels("removed").inc(sum(map(len, batch.removed.values())))
        return reply

    def _check_report(self, batch: AnnounceBatch) -> None:
        """Identity first (a report speaks only for its own instance), then the bounds."""
        if self.keys is not None and not check_announce_token(
            self.keys, batch.instance, batch.token
        ):
            raise Refusal(
                f"report for instance {batch.instance!r} does not carry that instance's announce "
                "token: one engine cannot report (or reset) for another",
                403,
                "identity",
            )
        num_keys = sum(map(len, batch.stored.values())) + sum(map(len, batch.removed.values()))
        if num_keys > self.config.max_report_keys:
            raise Refusal(
                f"report of {num_keys} keys exceeds index.service.max_report_keys "
                f"({self.config.max_report_keys}); split it",
                413,
                "size",
            )
        instances = self.state.instances
        if batch.instance not in instances and len(instances) >= self.config.max_instances:
            raise Refusal(
                f"the index tracks {len(instances)} instances (index.service.max_instances); "
                f"{batch.instance!r} is refused",
                429,
                "full",
            )

    def on_locate(self, request: LocateRequest) -> Any:
        if len(request.keys) > self.config.max_locate_keys:
            raise Refusal(
                f"locate of {len(request.keys)} keys exceeds index.service.max_locate_keys "
                f"({self.config.max_locate_keys})",
                413,
                "size",
            )
        return self.state.locate(request)

    def on_lookup(self, request: LookupRequest) -> Any:
        start = time.perf_counter()
        reply = self.state.lookup(request)
        _LOOKUP_S.observe(time.perf_counter() - start)
        return reply

    async def maintain(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            for instance in self.state.expire(self.config.instance_ttl_s):
                _EXPIRED.inc()
                log.warning("index: engine %s silent for %.0f s; forgotten",
                            instance, self.config.instance_ttl_s)  # fmt: skip
            swept = False
            while not swept:
                swept = self.state.index.sweep(self.config.sweep_batch)
                await asyncio.sleep(0)  # let requests in between sweep steps
            _ENTRIES.set(len(self.state.index))
            _INSTANCES.set(len(self.state.instances))


def build_app(
    config: IndexServiceConfig | None = None, keys: ClusterKeys | None = None
) -> Starlette:
    """The index app; with ``keys`` every route but ``/health`` authenticates its callers."""
    service = IndexService(config or IndexServiceConfig(), keys)

    async def instances(_: Request) -> Response:
        return JSONResponse({"epoch": service.state.epoch, "instances": service.state.summary()})

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok", "epoch": service.state.epoch})

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        zmq_server = _start_zmq(service)
        task = asyncio.create_task(service.maintain())
        log.info("index server up (epoch %s)", service.state.epoch)
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if zmq_server is not None:
            await zmq_server.aclose()

    operations = service.operations.items()
    limit = service.config.max_body_bytes
    routes = [
        *(
            Route(f"/{name}", _handler(name, op, limit), methods=["POST"])
            for name, op in operations
        ),
        Route("/instances", instances),
        Route("/health", health),
        Route("/metrics", metrics),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    if keys is not None:
        app.add_middleware(BearerAuth, keys=keys)
    app.state.service = service
    return app


def _start_zmq(service: IndexService) -> ZmqServer | None:
    config = service.config
    if config.zmq_port is None:
        return None
    # Imported here: HTTP alone needs no pyzmq.
    from kvstack.index.zmq_server import ZmqServer

    return ZmqServer(
        service.operations, config.host, config.zmq_port, service.keys, config.max_body_bytes
    ).start()
