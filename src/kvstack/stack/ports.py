"""Whether ``kvstack up`` can bind a port, checked as the servers themselves bind.

uvicorn, redis-server and ZMQ set ``SO_REUSEADDR``, so a port whose last connections sit in
TIME_WAIT (a stack stopped a moment ago) is free to them; a check without the option would
refuse it for a minute or two after ``kvstack down``. A port something still listens on is
refused either way.

:func:`free_port` picks below the kernel's ephemeral range: the kernel hands out ports in that
range to every outgoing connection and every bind to port 0 (an engine's own sockets, any HTTP
client), so a port it picked for us could be taken again before our server binds it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

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


LOWEST_PICKED = 10000  # free_port picks from here up to the ephemeral range
_picked: set[int] = set()  # handed out by this process: a port is not handed out twice
_random = random.SystemRandom()  # independent of any seed a caller set


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1", bus: bool = False) -> int:
    """A port free on ``host`` now, below the ephemeral range and not handed out before by
    this process (with ``bus``, one whose Redis Cluster bus port, +10000, is free too)."""
    high = min(_ephemeral_low(), 65536 - 10000 if bus else 65536)
    for _ in range(1000 if high > LOWEST_PICKED + 1000 else 0):
        port = _random.randrange(LOWEST_PICKED, high)
        if port in _picked or not port_is_bindable(host, port):
            continue
        if not bus or port_is_bindable(host, port + 10000):
            _picked.add(port)
            return port
    while True:  # no room below the ephemeral range: the kernel's pick
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
