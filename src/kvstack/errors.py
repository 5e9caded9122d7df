"""The kvstack exception hierarchy.

::

    KVStackError
     ├── ConfigError (ValueError)         a bad value; names the key and the allowed range
     ├── MissingExtraError (ImportError)  an optional dependency is missing; names the extra
     ├── KVError
     │    ├── ChunkFormatError            a stored chunk is truncated, corrupt or foreign
     │    │    └── ChunkMACError          unsigned, or not signed with this cluster's secret
     │    └── TierError                   a tier I/O failure (the cache degrades it to a miss)
     │         └── PeerProtocolError       a peer sent bytes that are not kvstack's peer protocol
     ├── RouterError
     │    ├── NoBackendError              no backend can serve the request
     │    ├── UpstreamError               a backend failed before the first byte
     │    └── RequestError                the client's request is refused (an HTTP 4xx)
     │         ├── AuthenticationError    a missing or unknown API key (401)
     │         └── UnknownModelError      no route and no backend serves the model (404)
     ├── IndexServiceError                the index service refused or failed a request (over ZMQ)
     │    └── IndexTimeoutError (TimeoutError)  no answer within the client's timeout
     ├── LoRAError
     │    ├── RegistryError               unknown adapter or version, invalid registry state
     │    ├── VerificationError           an artifact failed a check; ``reason`` says which
     │    ├── AdapterLoadError            an engine refused or failed a load; ``reason`` says why
     │    └── ColdStartError              an adapter cannot be made hot within the request's budget
     └── StackError                       a stack component failed to start or stop

A cache miss is never an exception: lookups return a count, and a failing optional tier is
logged, counted and treated as a miss by :class:`kvstack.kv.KVCache`.
"""

from __future__ import annotations

from kvstack.redact import redact_text

__all__ = [
    "AdapterLoadError",
    "AuthenticationError",
    "ChunkFormatError",
    "ChunkMACError",
    "ColdStartError",
    "ConfigError",
    "IndexServiceError",
    "IndexTimeoutError",
    "KVError",
    "KVStackError",
    "LoRAError",
    "MissingExtraError",
    "NoBackendError",
    "PeerProtocolError",
    "RegistryError",
    "RequestError",
    "RouterError",
    "StackError",
    "TierError",
    "UnknownModelError",
    "UpstreamError",
    "VerificationError",
    "require",
]


class KVStackError(Exception):
    """Base of every error kvstack raises on purpose. Its text never shows a password: a URL
    credential in the message is masked (:func:`kvstack.redact.redact_text`) wherever the
    error is printed or logged."""

    def __str__(self) -> str:
        return redact_text(super().__str__())


class ConfigError(KVStackError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class MissingExtraError(KVStackError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class KVError(KVStackError):
    """Errors of the KV cache layer."""


class ChunkFormatError(KVError):
    """A stored chunk failed its header or checksum verification.

    ``reason`` labels the rejection in ``kvstack_kv_chunks_rejected_total``: ``format`` (a bad
    or truncated header), ``checksum`` (the payload's XXH3), ``size`` (declared sizes that do
    not fit the expected layout), ``mac`` (:class:`ChunkMACError`)."""

    reason = "format"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class ChunkMACError(ChunkFormatError):
    """A chunk read while a cluster secret is configured carries no MAC, a MAC of another
    secret, or a MAC that does not match its header and payload: it is a miss."""

    reason = "mac"


class TierError(KVError):
    """A tier failed an operation; the tiered cache turns it into a miss."""


class PeerProtocolError(TierError):
    """A peer sent bytes that are not the peer protocol; the connection is closed."""


class RouterError(KVStackError):
    """Errors of the router."""


class NoBackendError(RouterError):
    """No backend is able to serve the request."""


class UpstreamError(RouterError):
    """A backend failed before the first byte of its answer.

    ``kind`` is connect | timeout | disconnect | status; ``status`` is the HTTP status the
    router answers with when no retry is left (502, or 504 for a timeout).
    """

    def __init__(self, message: str, kind: str = "error", status: int = 502) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


class RequestError(RouterError):
    """The client's request is refused; rendered in vLLM's error shape with ``status``.

    ``code`` is the router's own reason (sent as the ``x-kvstack-error`` header: vLLM's body
    carries the HTTP status as its code); ``kind`` a vLLM error type, when the status's usual
    one is not the right one (``kvstack.router.http.responses.error_type``).
    """

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = redact_text(message)  # sent to the client
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind
        self.retry_after_s = retry_after_s  # sent as Retry-After (a 429 or 503 that may pass)


class AuthenticationError(RequestError):
    """The request carries no API key, or one the router does not know."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 401, code="invalid_api_key")


class UnknownModelError(RequestError):
    """No model route and no backend serves the requested model; ``known`` lists the names."""

    def __init__(self, model: str, known: list[str]) -> None:
        names = ", ".join(known) or "none"
        super().__init__(
            f"The model {model!r} does not exist; known models: {names}",
            404,
            param="model",
            code="model_not_found",
        )
        self.known = known


class IndexServiceError(KVStackError):
    """The index service answered a request with an error; ``status`` is ``"400"`` (the request
    is invalid; the message names the problem) or ``"500"`` (the server failed)."""

    def __init__(self, message: str, status: str = "400") -> None:
        super().__init__(message)
        self.status = status


class IndexTimeoutError(IndexServiceError, TimeoutError):
    """The index service did not answer within the client's timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "timeout")


class LoRAError(KVStackError):
    """Errors of the LoRA adapter control plane."""


class RegistryError(LoRAError):
    """An adapter or version is unknown, or a registry operation is invalid."""


class VerificationError(LoRAError):
    """An adapter artifact failed verification."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class AdapterLoadError(LoRAError):
    """An engine refused or failed to load an adapter, or no slot freed in time."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ColdStartError(LoRAError):
    """An adapter cannot be made hot within the request's cold-start budget."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StackError(KVStackError):
    """A component of ``kvstack up`` failed to start, become healthy or stop."""


def require(module: str, extra: str) -> object:
    """Import ``module``, or raise :class:`MissingExtraError` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module!r} is not installed; install it with: pip install 'kvstack[{extra}]'"
        ) from exc
