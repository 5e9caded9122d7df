"""Free TCP ports on loopback, single or as a consecutive range (fleets on base + i)."""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_port_range"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(num: int, attempts: int = 100) -> int:
    """The first of ``num`` consecutive ports that are free right now."""
    for _ in range(attempts):
        base = free_port()
        if base + num > 65535:
            continue
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + num):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return base
    raise RuntimeError(f"found no {num} consecutive free ports")
