"""PeerClient: batched lookup and get against one engine's peer server (blocking; the server is
:class:`kvstack.cluster.peer_server.PeerServer`).

Each connection starts with the handshake of :mod:`kvstack.kv.tiers.peer.protocol`: with a
cluster secret, both sides prove they hold it before any LOOKUP or GET.

Payloads are received with ``recv_into`` straight into the caller's tensors and verified
against the header's checksum before they count as hits. A damaged payload is a miss on an
intact connection; a damaged header (its lengths cannot be trusted) or any socket error raises,
and the connection is discarded. Connections are pooled per server
(:class:`~kvstack.kv.tiers.remote.pool.SocketPool`, as the Redis tier's are).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from kvstack.errors import ChunkFormatError
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.peer import protocol as p
from kvstack.kv.tiers.remote.codec import (
    HEADER_BYTES,
    Pending,
    ReadResult,
    check_header,
    finish_later,
    fits,
    payload_target,
    settle,
    tensor_for,
)
from kvstack.kv.tiers.remote.pool import SocketPool
from kvstack.kv.trust import ChunkTrust

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["PeerClient", "parse_address"]


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"peer address must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


class _Connection:
    def __init__(
        self,
        address: tuple[str, int],
        connect_timeout_s: float,
        timeout_s: float,
        keys: ClusterKeys | None = None,
    ):
        self._sock = socket.create_connection(address, timeout=connect_timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(timeout_s)
        try:
            self._handshake(f"{address[0]}:{address[1]}", keys)
        except BaseException:
            self.close()
            raise

    def _handshake(self, peer: str, keys: ClusterKeys | None) -> None:
        """The connect-time handshake (see :mod:`kvstack.kv.tiers.peer.protocol`)."""
        hello = p.parse_hello(self.recv(p.HELLO.size))
        if hello.status != p.OK:
            reason = self.recv(min(hello.message_bytes, 4096)).decode("utf-8", "replace")
            raise p.ProtocolError(f"peer {peer} refused the connection: {reason}")
        if hello.auth == p.AUTH_NONE:
            if keys is not None:
                raise p.ProtocolError(
                    f"peer {peer} does not authenticate (it has no cluster secret): not used"
                )
            return
        if keys is None:
            raise p.ProtocolError(
                f"peer {peer} requires the cluster secret; set security.cluster_secret_file"
            )
        nonce = os.urandom(p.NONCE_BYTES)
        proof = p.prove(keys, b"client", hello.nonce, nonce)
        self.send(p.AUTH.pack(p.AUTH_MAGIC, nonce, proof))
        magic, status, length, server_proof = p.WELCOME.unpack(self.recv(p.WELCOME.size))
        if magic != p.WELCOME_MAGIC or status != p.OK:
            reason = self.recv(min(length, 4096)).decode("utf-8", "replace")
            raise p.ProtocolError(f"peer {peer} refused this engine's credentials: {reason}")
        if not p.check_proof(keys, b"server", server_proof, hello.nonce, nonce):
            raise p.ProtocolError(f"peer {peer} failed to prove it holds the cluster secret")

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def recv_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self._sock.recv_into(view[got:])
            if not n:
                raise ConnectionError("peer closed the connection mid-answer")
            got += n

    def recv(self, size: int) -> bytearray:
        buf = bytearray(size)
        self.recv_into(memoryview(buf))
        return buf

    def skip(self, size: int) -> None:
        scratch = memoryview(bytearray(min(size, 1 << 20)))
        while size:
            take = min(size, len(scratch))
            self.recv_into(scratch[:take])
            size -= take

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


class PeerClient:
    def __init__(
        self,
        address: str,
        connect_timeout_s: float = 0.5,
        timeout_s: float = 2.0,
        max_idle: int = 4,
        trust: ChunkTrust | None = None,
    ) -> None:
        self.address = address
        self._target = parse_address(address)
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.trust = trust or ChunkTrust()  # the MAC checks, and the keys of the handshake
        connect = functools.partial(
            _Connection, self._target, connect_timeout_s, timeout_s, self.trust.keys
        )
        self._pool = SocketPool(connect, max_idle)

    def lookup(self, keys: Sequence[ChunkKey]) -> list[bool]:
        with self._pool.connection() as conn:
            conn.send(p.pack_request(p.LOOKUP, list(keys)))
            answer = self._answer(conn, len(keys))
            if answer.status != p.OK:
                return [False] * len(keys)
            return [flag == 1 for flag in conn.recv(len(keys))]

    def get(
        self,
        keys: Sequence[ChunkKey],
        outs: Sequence[torch.Tensor | None],
        verifier: Executor | None = None,
    ) -> list[ReadResult] | None:
        """Read chunks into ``outs`` (a new tensor where None); None if the server is busy.
        Checksums run on ``verifier`` while the next chunk arrives, when one is given."""
        with self._pool.connection() as conn:
            conn.send(p.pack_request(p.GET, list(keys)))
            if self._answer(conn, len(keys)).status == p.BUSY:
                return None
            pending = [
                self._read_one(conn, k, o, verifier) for k, o in zip(keys, outs, strict=True)
            ]
            return settle(pending)

    def _answer(self, conn: _Connection, num_keys: int) -> p.Answer:
        answer = p.parse_answer(conn.recv(p.ANSWER.size))
        if answer.status == p.BAD_REQUEST:
            raise p.ProtocolError(f"peer {self.address}: {conn.recv(answer.num).decode()}")
        if answer.num != num_keys:
            raise p.ProtocolError(f"peer {self.address} answered {answer.num} of {num_keys} keys")
        return answer

    def _read_one(
        self, conn: _Connection, key: ChunkKey, out: torch.Tensor | None, verifier: Executor | None
    ) -> Pending:
        if not conn.recv(1)[0]:
            return ReadResult("miss")
        try:
            header = check_header(conn.recv(HEADER_BYTES), key, self.trust)
        except ChunkFormatError as exc:  # its lengths cannot be trusted: drop the connection
            raise p.PeerHeaderError(
                f"peer {self.address} sent a bad chunk header: {exc}", exc.reason
            ) from None
        tensor = tensor_for(header) if out is None else out
        if not fits(header, tensor):
            conn.skip(header.stored_bytes)
            return ReadResult("mismatch")
        target = payload_target(header, tensor)
        conn.recv_into(target.view)
        return finish_later(verifier, header, target, tensor, self.trust)

    def close(self) -> None:
        """Close idle connections now, and each one in use when its call ends."""
        self._pool.close()
