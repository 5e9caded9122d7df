"""vLLM's API key, as the simulator enforces it (``--api-key`` / ``VLLM_API_KEY``).

vLLM 0.32's ``AuthenticationMiddleware`` compares the ``Authorization: Bearer`` token's SHA-256
with the key's for every path under ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (OPTIONS
excepted) and answers ``401 {"error": "Unauthorized"}``; ``/health``, ``/metrics`` and the
other admin paths stay open. The simulator does the same, so a fleet of simulated engines
behaves like vLLM engines started with a key: only holders of the key (the router, with
``auth.upstream_api_key``) reach completions and the runtime LoRA endpoints.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["GUARDED_PREFIXES", "ApiKeyMiddleware"]

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


class ApiKeyMiddleware:
    """Pure ASGI middleware: ``ApiKeyMiddleware(app, api_key=KEY)``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(api_key.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path.startswith(GUARDED_PREFIXES) and not self._authorized(Headers(scope=scope)):
                await JSONResponse({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest)
