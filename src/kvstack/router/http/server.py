"""Build the uvicorn server that runs the router (used by the CLI, the benchmark and tests)."""

from __future__ import annotations

import importlib.util
import logging
import socket

import uvicorn

from kvstack.router.config import RouterConfig
from kvstack.router.http.app import RouterApp
from kvstack.router.router import Router

__all__ = ["RouterServer", "build_server"]

log = logging.getLogger(__name__)


def _fastest(module: str, fallback: str = "auto") -> str:
    return module if importlib.util.find_spec(module) is not None else fallback


class RouterServer(uvicorn.Server):
    """uvicorn's server that logs "router ready" once its listener is bound, not before: the
    router starts (health checks, discovery) in the lifespan, ahead of the bind, and a port in
    use then ends the process with uvicorn's own error."""

    def __init__(self, config: uvicorn.Config, router: Router) -> None:
        super().__init__(config)
        self.router = router

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            host, port = self.config.host, self.config.port
            log.info("router ready on http://%s:%d: %s", host, port, self.router.summary())


def build_server(config: RouterConfig, router: Router | None = None) -> uvicorn.Server:
    """A uvicorn server for ``config`` (httptools + uvloop when installed; no access log)."""
    router = router or Router(config)
    app = RouterApp(router)
    server_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop=_fastest("uvloop"),
        http=_fastest("httptools"),
        lifespan="on",
        access_log=False,
        log_config=None,  # keep the process's logging setup
        proxy_headers=False,  # the router is the edge; X-Forwarded-* is not trusted
        server_header=False,
        date_header=False,
        timeout_keep_alive=75,  # longer than common client pools keep idle connections
        backlog=4096,
        timeout_graceful_shutdown=30,  # streams may run for minutes; do not wait forever
    )
    return RouterServer(server_config, router)
