"""Which optional dependency belongs to which extra, and the one-line message when one is missing.

kvstack's heavy dependencies are extras (``pip install 'kvstack[kv]'``, ``[server]``, ``[redis]``,
``[s3]``, ``[lora]``, ...), and each extra works alone. When code reaches a module that an
uninstalled extra provides, the user gets one line naming the extra to install, not a traceback:
the CLI's top level and the plugin registry turn such a ``ModuleNotFoundError`` into
:class:`~kvstack.errors.MissingExtraError` with :func:`missing_extra`.

``tests/test_extras.py`` checks this table against ``pyproject.toml``, so a dependency added to
an extra without a line here fails a test.
"""

from __future__ import annotations

from kvstack.errors import MissingExtraError

__all__ = ["EXTRA_OF_MODULE", "extra_for", "missing_extra"]

# top-level import name -> the extra that installs it (the smallest one, where several do)
EXTRA_OF_MODULE: dict[str, str] = {
    "torch": "kv",
    "zstandard": "kv",
    "lz4": "kv",
    "starlette": "server",
    "uvicorn": "server",
    "httpx": "server",
    "aiohttp": "bench",
    "msgspec": "server",
    "zmq": "server",
    "cbor2": "server",
    "python_multipart": "server",
    "redis": "redis",
    "hiredis": "redis",
    "boto3": "s3",
    "botocore": "s3",
    "dateutil": "s3",
    "safetensors": "lora",
    "cryptography": "kv",  # chunk MACs; the lora extra installs it too (adapter signatures)
    "sqlalchemy": "lora",
    "psycopg": "postgres",
    "kubernetes": "k8s",
    "grpc": "epp",
    "grpc_health": "epp",
    "envoy": "epp",
    "matplotlib": "bench",
    "rich": "bench",
    "transformers": "hf",
    "tokenizers": "hf",
    "vllm": "vllm",
    "helm_python": "deploy",
    "kubernetes_validate": "deploy",
    "cloudcoil": "deploy",
}


def extra_for(exc: BaseException) -> str | None:
    """The extra whose module ``exc`` (a ModuleNotFoundError) failed to find, if it is one."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    return EXTRA_OF_MODULE.get(exc.name.partition(".")[0])


def missing_extra(exc: ModuleNotFoundError, what: str = "this feature") -> MissingExtraError:
    """A MissingExtraError for ``exc`` naming the extra, or one naming the bare module."""
    extra = extra_for(exc)
    module = (exc.name or "?").partition(".")[0]
    if extra is None:
        return MissingExtraError(f"{what} needs the Python module {module!r}, which is missing")
    return MissingExtraError(
        f"{what} needs the {extra!r} extra (module {module!r} is missing); "
        f"install it with: pip install 'kvstack[{extra}]'"
    )
