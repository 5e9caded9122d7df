"""A TCP spreader: each client connection goes to one replica, picked at random or in turn, as
kube-proxy spreads a Service's connections over its endpoints (iptables mode: at random; IPVS:
round-robin). Requests on a kept-alive connection stay with its replica, as in a cluster.

Bytes are copied both ways untouched (an L4 hop); every arm of ``kvstack bench routers``, a
single router included, goes through it, so that its cost falls on every arm alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Callable, Sequence

__all__ = ["Spreader", "picker"]

READ_BYTES = 1 << 16


def picker(kind: str, ports: Sequence[int], seed: int = 0) -> Callable[[], int]:
    """``random`` (kube-proxy's iptables mode) or ``round-robin`` (IPVS) over ``ports``."""
    if kind == "round-robin":
        turn = itertools.cycle(ports)
        return lambda: next(turn)
    if kind == "random":
        rng = random.Random(seed)
        return lambda: rng.choice(list(ports))
    raise ValueError(f"spread must be random or round-robin, got {kind!r}")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(READ_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


class Spreader:
    """``await Spreader(pick).serve(host, port)``: connections to ``host:port`` → a replica."""

    def __init__(self, pick: Callable[[], int], upstream_host: str = "127.0.0.1") -> None:
        self.pick = pick
        self.upstream_host = upstream_host
        self.connections: dict[int, int] = {}  # replica port -> connections sent there

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self.pick()
        self.connections[port] = self.connections.get(port, 0) + 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))

    async def serve(self, host: str, port: int, ready: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(self._handle, host, port, backlog=1024)
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()
