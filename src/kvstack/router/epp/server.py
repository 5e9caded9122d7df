"""``EppServer``: the router's brain behind Envoy's ext_proc service, on ``grpc.aio``.

One :class:`~kvstack.router.router.Router` is built from the ``router`` section (its discovery
replaced by the InferencePool's when ``epp.pool.name`` is set) and started as ``kvstack
router`` starts it: discovery, health checks, scrapes, prefix state, KV events, the LoRA
control plane. Each ext_proc stream (one HTTP request) is an
:class:`~kvstack.router.epp.stream.ExtProcStream` over the shared
:class:`~kvstack.router.epp.picker.EndpointPicker`.

Bounds (:mod:`kvstack.router.epp.limits`): at most ``epp.max_pending_decisions`` streams wait
for their pick (the next is refused with ``RESOURCE_EXHAUSTED``, so overload is a fast refusal,
never a queue that gRPC core ends with ``CANCELLED``), and a stream silent for
``epp.idle_timeout_s`` is closed with ``DEADLINE_EXCEEDED``.

Also served: the gRPC health service with the names GIE's protocol lists (``liveness``,
``readiness``, ``envoy.service.ext_proc.v3.ExternalProcessor``; readiness once the router has
started), on the ext_proc port and, plaintext, on ``health_port`` for kubelet probes; and
Prometheus metrics on ``metrics_port``.

Callers are authenticated like every kvstack listener: with a cluster secret, the gateway
sends ``authorization: Bearer <token>`` (:func:`epp_token`; Envoy's ``grpc_service``
``initial_metadata`` carries it); with ``tls.client_ca_file``, by its client certificate.
Without either, the port binds loopback only unless ``security.insecure_no_auth`` says
otherwise (:func:`kvstack.security.check_bind`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvstack.router.epp.config import EppConfig
from kvstack.router.epp.limits import DecisionGate, IdleWatchdog
from kvstack.router.epp.objectives import ObjectiveBook
from kvstack.router.epp.picker import EndpointPicker
from kvstack.router.epp.stream import ANSWERS, ExtProcStream
from kvstack.router.epp.tls import server_credentials
from kvstack.router.router import Router
from kvstack.security import ClusterKeys, SecurityConfig, check_bind

__all__ = ["EXT_PROC_SERVICE", "EppServer", "epp_token"]

log = logging.getLogger(__name__)
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_NAMES = ("", "liveness", "readiness", EXT_PROC_SERVICE)
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
REFUSED_OVERLOAD = ANSWERS.labels("overloaded")  # RESOURCE_EXHAUSTED: the gate was full
REFUSED_IDLE = ANSWERS.labels("idle_timeout")  # DEADLINE_EXCEEDED: the gateway fell silent


def epp_token(keys: ClusterKeys) -> str:
    """The bearer token a gateway sends the EPP, derived from the cluster secret."""
    return keys.mac("epp", b"ext_proc", size=32).hex()


class ExtProcService(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, picker: EndpointPicker, config: EppConfig, keys: ClusterKeys | None):
        self.picker = picker
        self.config = config
        self._keys = keys
        self.gate = DecisionGate(config.max_pending_decisions)

    async def Process(
        self, request_iterator: AsyncIterator[ext_proc.ProcessingRequest], context: Any
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        if self._keys is not None and not self._authorized(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong EPP token")
        gate = self.gate
        if not gate.enter():
            REFUSED_OVERLOAD.inc()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the endpoint picker has {gate.limit} requests waiting for a pick "
                "(epp.max_pending_decisions); the gateway's failure mode decides",
            )
        stream = ExtProcStream(
            self.picker, self.config.request_body_mode, self.config.response_body_mode
        )
        watchdog = IdleWatchdog(self.config.idle_timeout_s)
        deciding = True
        messages = request_iterator.__aiter__()
        try:
            while True:
                watchdog.waiting = True
                try:
                    message = await messages.__anext__()
                except StopAsyncIteration:
                    return
                watchdog.waiting = False
                watchdog.touch()
                responses = await stream.handle(message)
                if deciding and (stream.placement is not None or stream.done):
                    # Before the pick goes out: the generator stays suspended at its yield
                    # until gRPC has sent it, and a stream arriving meanwhile must find the
                    # place free.
                    deciding = False
                    gate.leave()
                for response in responses:
                    yield response
                if stream.done:
                    return
        except asyncio.CancelledError:
            if not watchdog.expired:
                raise
            _uncancel()
            REFUSED_IDLE.inc()
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no ext_proc message for {watchdog.timeout_s:g} s (epp.idle_timeout_s)",
            )
        finally:
            if deciding:
                gate.leave()
            watchdog.close()
            stream.close()

    def _authorized(self, context: Any) -> bool:
        assert self._keys is not None
        sent = dict(context.invocation_metadata() or ()).get("authorization", "")
        scheme, _, token = sent.partition(" ")
        tag = bytes.fromhex(token) if scheme.lower() == "bearer" and _is_hex(token) else b""
        return len(tag) == 32 and self._keys.check("epp", tag, b"ext_proc")


class EppServer:
    """``start`` / ``wait`` / ``stop``; ``port`` is the bound ext_proc port (0 picks one)."""

    def __init__(
        self,
        router: Router,
        config: EppConfig,
        security: SecurityConfig | None = None,
        keys: ClusterKeys | None = None,
        objectives: ObjectiveBook | None = None,
        watches: list[Any] | None = None,
    ) -> None:
        self.router = router
        self.config = config
        self.security = security or SecurityConfig()
        self.keys = keys
        self.picker = EndpointPicker(router, config, objectives)
        self.service = ExtProcService(self.picker, config, keys)
        self.watches = watches or []  # objective watches, started after the router
        self.health = health.aio.HealthServicer()
        self.port = config.port
        self.health_port = config.health_port
        self._servers: list[grpc.aio.Server] = []

    async def start(self) -> None:
        cfg = self.config
        if cfg.tls.client_ca_file is None:  # mutual TLS authenticates the caller by itself
            check_bind(cfg.host, "the endpoint picker", self.keys, self.security)
        for name in HEALTH_NAMES:
            await self.health.set(name, _SERVING if name in ("", "liveness") else _NOT_SERVING)
        main = self._server(cfg.max_streams)
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(self.service, main)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, main)
        address = f"{_host(cfg.host)}:{cfg.port}"
        credentials = server_credentials(cfg.tls)
        if credentials is None:
            self.port = main.add_insecure_port(address)
        else:
            self.port = main.add_secure_port(address, credentials)
        if cfg.health_port:
            probes = self._server(64)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, probes)
            self.health_port = probes.add_insecure_port(f"{_host(cfg.host)}:{cfg.health_port}")
        await self.router.start()
        try:
            for watch in self.watches:
                await watch.start()
            for server in self._servers:
                await server.start()
        except BaseException:  # a watch refused (an API version not served): undo the start
            for watch in self.watches:
                await watch.close()
            await self.router.close()
            raise
        if cfg.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(cfg.metrics_port, addr=cfg.host)
        for name in ("readiness", EXT_PROC_SERVICE):
            await self.health.set(name, _SERVING)
        log.info(
            "endpoint picker ready on %s:%d (%s), %d backends",
            cfg.host, self.port, "TLS" if credentials else "plaintext", len(self.router.pool),
        )  # fmt: skip

    def _server(self, max_streams: int) -> grpc.aio.Server:
        limit = self.router.config.limits.max_request_bytes + 2**20
        pending = self.config.max_pending_decisions
        server = grpc.aio.server(
            options=[
                ("grpc.max_concurrent_streams", max_streams),
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                # Calls gRPC core holds because a saturated event loop has not taken them yet:
                # bounded too, or they wait seconds before core cancels them (limits.py).
                ("grpc.server.max_pending_requests", pending),
                ("grpc.server.max_pending_requests_hard_limit", 2 * pending),
            ]
        )
        self._servers.append(server)
        return server

    async def wait(self) -> None:
        await asyncio.gather(*(s.wait_for_termination() for s in self._servers))

    async def stop(self) -> None:
        for name in HEALTH_NAMES:
            await self.health.set(name, _NOT_SERVING)
        await asyncio.gather(*(s.stop(self.config.grace_s) for s in self._servers))
        for watch in reversed(self.watches):
            await watch.close()
        await self.router.close()


def _uncancel() -> None:
    """The watchdog's cancellation is handled here: the task goes on to send the status."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):  # Python 3.11+
        task.uncancel()


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True
