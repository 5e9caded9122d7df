"""Run the index app with uvicorn: in the foreground (``kvstack index-server``) or on a thread
of its own (tests, benchmarks, an all-in-one process). Both refuse to listen beyond loopback
without the cluster's keys (:func:`kvstack.security.check_bind`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

import uvicorn

from kvstack.errors import StackError
from kvstack.index.config import IndexServiceConfig
from kvstack.index.service import build_app
from kvstack.index.urls import zmq_url
from kvstack.security import SecurityConfig, check_bind

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["IndexServerThread", "serve"]


def _server(
    config: IndexServiceConfig, keys: ClusterKeys | None, security: SecurityConfig | None
) -> uvicorn.Server:
    check_bind(config.host, "the index server", keys, security or SecurityConfig())
    uv = uvicorn.Config(
        build_app(config, keys),
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        loop="auto",
        http="auto",
    )
    return uvicorn.Server(uv)


def serve(
    config: IndexServiceConfig,
    keys: ClusterKeys | None = None,
    security: SecurityConfig | None = None,
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM)."""
    _server(config, keys, security).run()


class IndexServerThread:
    def __init__(
        self,
        config: IndexServiceConfig,
        keys: ClusterKeys | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        self.config = config
        self._server = _server(config, keys, security)
        self._thread = threading.Thread(target=self._run, name="kvstack-index", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def zmq_url(self) -> str | None:
        """``zmq://host:port`` when the server answers over ZMQ too."""
        if self.config.zmq_port is None:
            return None
        return zmq_url(self.config.host, self.config.zmq_port)

    def _run(self) -> None:
        asyncio.run(self._server.serve())

    def start(self, timeout_s: float = 10.0) -> IndexServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise StackError(f"index server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
