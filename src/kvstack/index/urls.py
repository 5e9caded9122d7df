"""Index server URLs: ``http(s)://host:port`` or ``zmq://host:port`` (the server's ``zmq_port``),
and the ZMQ endpoints they name. No third-party imports: config sections check URLs with it."""

from __future__ import annotations

from urllib.parse import urlsplit

from kvstack.errors import ConfigError

__all__ = ["SCHEME", "check_index_url", "tcp_address", "tcp_endpoint", "zmq_url"]

SCHEME = "zmq"


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
    """An index server URL: ``http(s)://host:port`` or ``zmq://host:port``; raises
    :class:`ConfigError` naming the accepted forms otherwise."""
    scheme = urlsplit(url).scheme
    if scheme == SCHEME:
        tcp_endpoint(url)
    elif scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ConfigError(
            f"index URL must be http://host:port, https://host:port or zmq://host:port, got {url!r}"
        )
    return url
