"""Index URLs: the index server's ``http(s)://host:port`` or ``zmq://host:port`` (its
``zmq_port``) and the ZMQ endpoints they name, or Valkey's ``redis(s)://``. No third-party
imports: config sections check URLs with it."""

from __future__ import annotations

from urllib.parse import urlsplit

from kvstack.errors import ConfigError

__all__ = [
    "SCHEME",
    "VALKEY_SCHEMES",
    "check_index_url",
    "redact_url",
    "tcp_address",
    "tcp_endpoint",
    "zmq_url",
]

SCHEME = "zmq"
VALKEY_SCHEMES = ("redis", "rediss")


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 hosts in brackets


def tcp_address(host: str, port: int) -> str:
    """The ZMQ endpoint a server binds (or a client connects to) for ``host`` and ``port``."""
    return f"tcp://{_host_port(host, port)}"


def zmq_url(host: str, port: int) -> str:
    """The ``zmq://`` URL clients are given for a server at ``host`` and ``port``."""
    return f"{SCHEME}://{_host_port(host, port)}"


def tcp_endpoint(url: str) -> str:
    """``zmq://host:port`` → ``tcp://host:port`` (IPv6 hosts keep their brackets)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != SCHEME or not parts.hostname or port is None or parts.path.strip("/"):
        raise ConfigError(f"index ZMQ URL must look like zmq://host:port, got {url!r}")
    return tcp_address(parts.hostname, port)


def check_index_url(url: str) -> str:
    """An index URL: the index server's ``http(s)://host:port`` or ``zmq://host:port``, or
    Valkey's ``redis://`` / ``rediss://`` (:mod:`kvstack.index.valkey.url` checks the rest when
    it connects); raises :class:`ConfigError` naming the accepted forms otherwise."""
    scheme = urlsplit(url).scheme
    if scheme == SCHEME:
        tcp_endpoint(url)
    elif scheme not in ("http", "https", *VALKEY_SCHEMES) or not urlsplit(url).netloc:
        raise ConfigError(
            "index URL must be http://host:port, https://host:port, zmq://host:port (the index "
            f"server) or redis://host:port, rediss://host:port (Valkey), got {redact_url(url)!r}"
        )
    return url


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: fit for logs and errors."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not at or not colon:
        return url
    return parts._replace(netloc=f"{user}:***@{hosts}").geturl()
