"""Whether ``kvstack up`` can bind a port, checked as the servers themselves bind.

uvicorn, redis-server and ZMQ set ``SO_REUSEADDR``, so a port whose last connections sit in
TIME_WAIT (a stack stopped a moment ago) is free to them; a check without the option would
refuse it for a minute or two after ``kvstack down``. A port something still listens on is
refused either way.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_port_run", "port_is_bindable"]


def port_is_bindable(host: str, port: int) -> bool:
    """True when a server may listen on ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", bus: bool = False) -> int:
    """A port free on ``host`` now, picked by the kernel (with ``bus``, one whose Redis
    Cluster bus port, +10000, is free too)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if not bus or (port + 10000 < 65536 and port_is_bindable(host, port + 10000)):
            return port


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive ports free on ``host`` now (a simulated fleet's)."""
    for _ in range(100):
        base = free_port(host)
        if base + count < 65536 and all(port_is_bindable(host, base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")
