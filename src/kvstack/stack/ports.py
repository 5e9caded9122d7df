"""Whether ``kvstack up`` can bind a port, checked as the servers themselves bind.

uvicorn, redis-server and ZMQ set ``SO_REUSEADDR``, so a port whose last connections sit in
TIME_WAIT (a stack stopped a moment ago) is free to them; a check without the option would
refuse it for a minute or two after ``kvstack down``. A port something still listens on is
refused either way.
"""

from __future__ import annotations

import socket

__all__ = ["port_is_bindable"]


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
