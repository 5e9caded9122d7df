"""Helper processes for the shared-tier benchmark, started with ``spawn`` so each side of a
transfer has its own interpreter and GIL — as a Redis server, an S3 endpoint or another engine
would: a loopback TCP sender (the reference) and a peer-lending engine with chunks in its CPU
tier."""

from __future__ import annotations

import multiprocessing
import socket
import struct
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["LENDER_MODEL", "lender_keys", "start_lender", "start_tcp_sender", "tcp_fetch"]

LENDER_MODEL = "bench@1"
_REQUEST = struct.Struct("<Q")


def start_tcp_sender(chunk_bytes: int) -> tuple[Any, int]:
    """A process that answers each 8-byte request ``n`` with ``n`` bytes from memory."""
    return _start(_tcp_sender, chunk_bytes)


def start_lender(chunk_shape: tuple[int, ...], num_chunks: int) -> tuple[Any, int]:
    """A process whose KVCache holds ``num_chunks`` chunks (keys: :func:`lender_keys`) and
    lends them through a PeerServer; returns the process and the server's port."""
    return _start(_lender, chunk_shape, num_chunks)


def lender_keys(chunk_tokens: int, num_chunks: int) -> list[bytes]:
    from kvstack.kv.keys import Namespace, chunk_keys

    tokens = list(range(chunk_tokens * num_chunks))
    return list(chunk_keys(tokens, Namespace(LENDER_MODEL, "bfloat16"), chunk_tokens))


def _start(target: Any, *args: Any) -> tuple[Any, int]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    if not parent.poll(120):
        proc.kill()
        raise RuntimeError(f"benchmark helper {target.__name__} did not start")
    port: int = parent.recv()
    return proc, port


def _tcp_sender(ready: Connection, chunk_bytes: int) -> None:
    payload = memoryview(bytearray(b"\x5a" * chunk_bytes))
    with socket.create_server(("127.0.0.1", 0)) as server:
        ready.send(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while head := conn.recv(_REQUEST.size):
                (remaining,) = _REQUEST.unpack(head)
                while remaining:
                    piece = payload[: min(remaining, len(payload))]
                    conn.sendall(piece)
                    remaining -= len(piece)


def tcp_fetch(sock: socket.socket, buffers: list[memoryview]) -> None:
    """Ask the sender for ``sum(len(buffers))`` bytes and receive them into ``buffers``."""
    sock.sendall(_REQUEST.pack(sum(len(b) for b in buffers)))
    for view in buffers:
        got = 0
        while got < len(view):
            got += sock.recv_into(view[got:])


def _lender(ready: Connection, chunk_shape: tuple[int, ...], num_chunks: int) -> None:
    import asyncio

    import torch

    from kvstack.cluster.config import PeerServerConfig
    from kvstack.cluster.peer_server import PeerServer
    from kvstack.kv.tiers.cpu.tier import CPUTier

    chunk_bytes = int(torch.Size(chunk_shape).numel()) * 2
    tier = CPUTier(chunk_bytes * (num_chunks + 1), name="cpu")
    for i, key in enumerate(lender_keys(chunk_shape[2], num_chunks)):
        data = torch.full(chunk_shape, float(i % 7), dtype=torch.bfloat16)
        tier.put(key, data)  # type: ignore[arg-type]
    server = PeerServer([tier], PeerServerConfig(host="127.0.0.1", port=0, max_streams=8))
    ready.send(server.bind())
    asyncio.run(server.serve())
