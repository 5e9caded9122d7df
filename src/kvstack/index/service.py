"""The cluster KV index service: a Starlette app over :class:`~kvstack.index.state.IndexState`.

Routes (bodies are JSON, or msgpack with ``Content-Type: application/msgpack``; answers use the
request's format):

- ``POST /events`` — an engine's report (:class:`~kvstack.index.protocol.AnnounceBatch`).
- ``POST /lookup`` — per engine and per tier, the matched prefix of a prompt.
- ``POST /locate`` — which engines lend each chunk (used by ``peer://`` tiers).
- ``GET /instances``, ``GET /health``, ``GET /metrics``.

With ``index.service.zmq_port`` set, the same operations (``events``, ``lookup``, ``locate``) are
also answered over ZMQ (:mod:`kvstack.index.zmq_server`), on the same event loop.

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

from kvstack.index.config import IndexServiceConfig
from kvstack.index.operations import REFUSED, Operation, count_request
from kvstack.index.protocol import AnnounceBatch, LocateRequest, LookupRequest
from kvstack.index.state import IndexState
from kvstack.metrics import counter, gauge, histogram

if TYPE_CHECKING:
    from kvstack.index.zmq_server import ZmqServer

__all__ = ["IndexService", "build_app"]

log = logging.getLogger(__name__)
M = TypeVar("M")
MSGPACK = "application/msgpack"

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


def _handler(route: str, operation: Operation) -> Callable[[Request], Any]:
    async def handle(request: Request) -> Response:
        body = await request.body()
        try:
            message = _decode(request, body, operation.kind)
            result = operation.answer(message)
        except REFUSED as exc:
            count_request(route, "400")
            return JSONResponse({"error": str(exc)}, status_code=400)
        count_request(route, "200")
        return _encode(request, result)

    return handle


class IndexService:
    """The app's state and its maintenance loop."""

    def __init__(self, config: IndexServiceConfig) -> None:
        self.config = config
        self.state = IndexState(config.max_lookup_tokens)
        self.operations = {
            "events": Operation(AnnounceBatch, self.on_events),
            "lookup": Operation(LookupRequest, self.on_lookup),
            "locate": Operation(LocateRequest, self.state.locate),
        }

    def on_events(self, batch: AnnounceBatch) -> Any:
        reply = self.state.apply(batch)
        if reply.resync:
            _RESYNCS.inc()
        else:
            _EVENT_KEYS.labels("stored").inc(sum(map(len, batch.stored.values())))
            _EVENT_KEYS.labels("removed").inc(sum(map(len, batch.removed.values())))
        return reply

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


def build_app(config: IndexServiceConfig | None = None) -> Starlette:
    service = IndexService(config or IndexServiceConfig())

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
    routes = [
        *(Route(f"/{name}", _handler(name, op), methods=["POST"]) for name, op in operations),
        Route("/instances", instances),
        Route("/health", health),
        Route("/metrics", metrics),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.service = service
    return app


def _start_zmq(service: IndexService) -> ZmqServer | None:
    if service.config.zmq_port is None:
        return None
    # Imported here: HTTP alone needs no pyzmq.
    from kvstack.index.zmq_server import ZmqServer

    return ZmqServer(service.operations, service.config.host, service.config.zmq_port).start()
