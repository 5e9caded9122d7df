"""Health probes for stack components: HTTP ``/health`` and redis ``PING``."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from kvstack.stack.components import Component

__all__ = ["healthy"]


def healthy(component: Component, timeout_s: float = 2.0) -> bool:
    if component.health == "redis":
        return _redis_ping(component.host, component.port, timeout_s)
    try:
        with urllib.request.urlopen(component.health_url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _redis_ping(host: str, port: int, timeout_s: float) -> bool:
    """Up when it answers PING, or refuses it for want of the password (it is serving)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False
