"""What a peer connection passes before the peer server answers anything: connection limits
(per client address and in total) and, with a cluster secret, the connect-time challenge of
:mod:`kvstack.kv.tiers.peer.protocol`. Every read and write here has a deadline; every refusal
tells the client why (when it can still be told) and is counted in
``kvstack_peer_refused_total{reason}``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from typing import TYPE_CHECKING

from kvstack.errors import PeerProtocolError
from kvstack.kv.tiers.peer import protocol as p
from kvstack.metrics import counter

if TYPE_CHECKING:
    import socket

    from kvstack.security import ClusterKeys

__all__ = ["ConnectionLimits", "admit", "recv_exact", "refused", "send", "turn_away"]

_REFUSED = counter(
    "kvstack_peer_refused_total",
    "Peer connections or requests refused, by reason: connections (a limit), auth, "
    "bad_request, too_many_keys, timeout (a read or write past its deadline)",
    ["reason"],
)


def refused(reason: str) -> None:
    _REFUSED.labels(reason).inc()


class ConnectionLimits:
    """Open connections per client address and in total (on the event loop and the accept
    path only; a lock keeps ``stats`` readers from other threads consistent)."""

    def __init__(self, max_total: int, max_per_peer: int) -> None:
        self.max_total, self.max_per_peer = max_total, max_per_peer
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def acquire(self, peer: str) -> str | None:
        """None when admitted (call :meth:`release` later), else the refusal's reason."""
        with self._lock:
            if sum(self._open.values()) >= self.max_total:
                return f"the peer server holds {self.max_total} connections (max_connections)"
            if self._open[peer] >= self.max_per_peer:
                return (
                    f"{peer} holds {self.max_per_peer} connections already "
                    "(max_connections_per_peer)"
                )
            self._open[peer] += 1
            return None

    def release(self, peer: str) -> None:
        with self._lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    @property
    def num_open(self) -> int:
        with self._lock:
            return sum(self._open.values())


async def send(conn: socket.socket, data: bytes | memoryview, timeout_s: float) -> None:
    """``sendall`` with a deadline: a client that stops reading is cut off (TimeoutError)."""
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(loop.sock_sendall(conn, data), timeout_s)


async def recv_exact(conn: socket.socket, size: int, timeout_s: float) -> bytearray | None:
    """``size`` bytes within ``timeout_s`` (TimeoutError), or None if the peer closed the
    connection before sending any."""
    return await asyncio.wait_for(_recv_exact(conn, size), timeout_s)


async def _recv_exact(conn: socket.socket, size: int) -> bytearray | None:
    loop = asyncio.get_running_loop()
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = await loop.sock_recv_into(conn, view[got:])
        if not n:
            if got:
                raise p.ProtocolError(f"connection closed mid-message ({got} of {size} bytes)")
            return None
        got += n
    return buf


async def admit(conn: socket.socket, keys: ClusterKeys | None, timeout_s: float) -> bool:
    """Send HELLO and, with a secret, run the challenge; whether the client may go on."""
    nonce = os.urandom(p.NONCE_BYTES)
    auth = p.AUTH_NONE if keys is None else p.AUTH_CHALLENGE
    await send(conn, p.pack_hello(p.OK, auth, nonce), timeout_s)
    if keys is None:
        return True
    raw = await recv_exact(conn, p.AUTH.size, timeout_s)
    if raw is None:
        return False
    magic, client_nonce, proof = p.AUTH.unpack(raw)
    if magic != p.AUTH_MAGIC or not p.check_proof(keys, b"client", proof, nonce, client_nonce):
        refused("auth")
        reason = b"authentication failed: this peer server requires the cluster secret"
        await send(
            conn, p.WELCOME.pack(p.WELCOME_MAGIC, p.REFUSED, len(reason), bytes(16)), timeout_s
        )
        await send(conn, reason, timeout_s)
        return False
    mine = p.prove(keys, b"server", nonce, client_nonce)
    await send(conn, p.WELCOME.pack(p.WELCOME_MAGIC, p.OK, 0, mine), timeout_s)
    return True


async def turn_away(conn: socket.socket, reason: str, timeout_s: float) -> None:
    """Answer HELLO REFUSED with ``reason`` (best effort: the connection closes next)."""
    message = reason.encode()
    try:
        await send(conn, p.pack_hello(p.REFUSED, p.AUTH_NONE, bytes(16), message), timeout_s)
    except (OSError, TimeoutError, PeerProtocolError):
        pass
