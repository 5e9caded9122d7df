"""The control-plane HTTP client: health checks, model lists, metric scrapes (aiohttp).

These requests are few (a handful per backend per second), so they use aiohttp, a complete
client, rather than the lean connection pool of the proxied path
(:mod:`kvstack.router.upstream.pool`). Failures become :class:`UpstreamError` with a kind
(connect, timeout, disconnect, error).
"""

from __future__ import annotations

import sys

import aiohttp

from kvstack.errors import UpstreamError
from kvstack.router.config import TimeoutsConfig

if sys.version_info >= (3, 11):
    from asyncio import timeout
else:  # pragma: no cover - aiohttp depends on async-timeout before 3.11
    from async_timeout import timeout

__all__ = ["UpstreamClient", "as_upstream_error", "timeout"]


def as_upstream_error(exc: BaseException, backend: str) -> UpstreamError:
    """Classify a client-side failure talking to ``backend``."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError(f"cannot connect to backend {backend}: {exc.os_error}", "connect")
    if isinstance(exc, TimeoutError):
        return UpstreamError(f"backend {backend} timed out", "timeout", 504)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return UpstreamError(f"backend {backend} closed the connection: {exc}", "disconnect")
    return UpstreamError(f"backend {backend} failed: {type(exc).__name__}: {exc}", "error")


class UpstreamClient:
    """A keep-alive connection pool to every backend; start() before use, close() after."""

    def __init__(self, timeouts: TimeoutsConfig) -> None:
        self._timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._session

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """A small GET (health, models, metrics) bounded by ``timeout_s`` in all."""
        try:
            async with timeout(timeout_s), self.session.get(url, allow_redirects=False) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise as_upstream_error(exc, url) from None
