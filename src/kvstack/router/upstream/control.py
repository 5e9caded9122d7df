"""The control-plane HTTP client: health checks, model lists, metric scrapes (httpx).

These requests are few (per backend: a health check every ``health.interval_s``, its model list
every ``models_interval_s``, a scrape every ``scrape.interval_s``), so they use httpx, the one
async HTTP client library of the router process (the index lookups and the adapter manager's
engine calls use it too), rather than the lean connections of the proxied path
(:mod:`kvstack.router.upstream.pool`). Each GET is bounded by its timeout as a whole, connect
to last byte. Compression is refused (``accept-encoding: identity``): a metrics page is read
on every scrape, and inflating it would cost more than the loopback or LAN transfer saves.
Failures become :class:`UpstreamError` with a kind (connect, timeout, disconnect, error).
"""

from __future__ import annotations

import asyncio

import httpx
from pydantic import SecretStr

from kvstack.errors import UpstreamError

__all__ = ["ControlClient"]

# Below uvicorn's 5 s keep-alive (vLLM's server): an idle connection is closed here first.
KEEPALIVE_EXPIRY_S = 4.0
_HEADERS = {"accept-encoding": "identity", "user-agent": "kvstack-router"}


def _upstream_error(exc: BaseException, backend: str) -> UpstreamError:
    """Classify a client-side failure talking to ``backend``."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, httpx.ConnectError) and _refused(exc):
        return UpstreamError(f"connection refused to {backend}", "connect")
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return UpstreamError(f"cannot connect to backend {backend}: {exc}", "connect")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return UpstreamError(f"backend {backend} timed out", "timeout", 504)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return UpstreamError(f"backend {backend} closed the connection: {exc}", "disconnect")
    return UpstreamError(f"backend {backend} failed: {type(exc).__name__}: {exc}", "error")


def _refused(exc: httpx.ConnectError) -> bool:
    """Nothing listens there (httpx words a refusal on every address of a host as its last
    words, and one on a single address as the OS's errno text)."""
    cause = exc.__cause__ or exc.__context__
    text = str(exc).lower()
    return (
        isinstance(cause, ConnectionRefusedError)
        or "refused" in text
        or ("all connection attempts failed" in text)
    )


class ControlClient:
    """A keep-alive connection pool to every backend; start() before use, close() after."""

    def __init__(self, api_key: SecretStr | None = None) -> None:
        self._client: httpx.AsyncClient | None = None
        self._headers = dict(_HEADERS)
        if api_key is not None:  # vLLM's API key guards /v1/models too
            self._headers["authorization"] = f"Bearer {api_key.get_secret_value()}"

    async def start(self) -> None:
        if self._client is None:
            limits = httpx.Limits(
                max_connections=None,
                max_keepalive_connections=None,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            )
            self._client = httpx.AsyncClient(
                limits=limits, headers=self._headers, follow_redirects=False, timeout=None
            )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("ControlClient.start() was not called")
        return self._client

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """A small GET (health, models, metrics) bounded by ``timeout_s`` in all."""
        try:
            response = await asyncio.wait_for(self.client.get(url), timeout_s)
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            raise _upstream_error(exc, url) from None
        return response.status_code, response.content
