"""PeerServer: lends the chunks of an engine's local tiers (CPU, disk) to other engines.

asyncio with raw non-blocking sockets: payloads go from tier memory to the socket with
``sock_sendall`` (no copy into a transport buffer). Tier reads and checksums run on a small
thread pool, never on the event loop. At most ``max_streams`` GET answers stream at once; a
GET beyond that is answered BUSY immediately (back-pressure the asking engine turns into a
fallback), and TCP flow control paces each stream. Headers (with the payload checksum) of
chunks already sent are remembered: chunks are immutable under their content-addressed key.

Run embedded (``PeerServer.for_cache(cache, config).start_background()``) or alone
(``kvstack peer-server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

from kvstack.cluster.config import PeerServerConfig
from kvstack.kv.affinity import enter_background
from kvstack.kv.format import encode_header
from kvstack.kv.keys import KEY_BYTES, ChunkKey
from kvstack.kv.tensors import byte_view, dtype_name, torch
from kvstack.kv.tiers.peer import protocol as p
from kvstack.metrics import counter

if TYPE_CHECKING:
    from kvstack.kv.cache import KVCache
    from kvstack.kv.tiers.base import Tier

__all__ = ["PeerServer"]

log = logging.getLogger(__name__)
HEADERS_KEPT = 65_536

_SERVED = counter("kvstack_peer_served_chunks_total", "Chunks sent to peers")
_SERVED_BYTES = counter("kvstack_peer_served_bytes_total", "Payload bytes sent to peers")
_BUSY = counter("kvstack_peer_busy_total", "GET requests answered BUSY (back-pressure)")


class Outgoing(NamedTuple):
    header: bytes
    payload: memoryview
    chunk: torch.Tensor  # keeps the payload's memory (and a CPU-tier lease) alive


class PeerServer:
    def __init__(self, tiers: Sequence[Tier], config: PeerServerConfig | None = None) -> None:
        self.tiers = list(tiers)
        self.config = config or PeerServerConfig()
        self.port = self.config.port
        self._streams = 0
        self._headers: OrderedDict[tuple[ChunkKey, str, tuple[int, ...]], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(4, "kvstack-peer-io", enter_background)
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping: asyncio.Event | None = None

    @classmethod
    def for_cache(cls, cache: KVCache, config: PeerServerConfig | None = None) -> PeerServer:
        """Lend the cache's local tiers (shared stores are reachable by everyone anyway)."""
        return cls([t for t in cache.tiers if not t.shared], config)

    # -- lifecycle -------------------------------------------------------------------------
    def bind(self) -> int:
        """Open the listening socket (port 0: any free port); returns the port."""
        sock = socket.create_server((self.config.host, self.config.port), backlog=128)
        sock.setblocking(False)
        self._listener = sock
        self.port = sock.getsockname()[1]
        return self.port

    async def serve(self) -> None:
        """Accept and serve connections until :meth:`stop`."""
        if self._listener is None:
            self.bind()
        assert self._listener is not None
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        accept = asyncio.create_task(self._accept_loop(self._listener))
        await self._stopping.wait()
        accept.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(accept, *self._tasks, return_exceptions=True)
        self._listener.close()

    def start_background(self) -> int:
        """Serve on a thread of its own (inside an engine process); returns the port."""
        port = self.bind()
        ready = threading.Event()

        def run() -> None:
            async def main() -> None:
                serving = asyncio.create_task(self.serve())
                await asyncio.sleep(0)
                ready.set()
                await serving

            asyncio.run(main())

        self._thread = threading.Thread(target=run, name="kvstack-peer-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        return port

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- connections -----------------------------------------------------------------------
    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._serve_connection(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_connection(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                head = await asyncio.wait_for(
                    _recv_exact(loop, conn, p.REQUEST.size), self.config.timeout_s
                )
                if head is None:
                    return
                if not await self._answer(loop, conn, head):
                    return
        except (OSError, TimeoutError, p.ProtocolError) as exc:
            log.debug("peer connection closed: %r", exc)
        finally:
            conn.close()

    async def _answer(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, head: bytearray
    ) -> bool:
        request = p.parse_request(head)
        if request.num_keys > self.config.max_keys_per_request:
            message = f"{request.num_keys} keys > max_keys_per_request".encode()
            await loop.sock_sendall(conn, p.pack_answer(p.BAD_REQUEST, len(message)) + message)
            return False
        raw = await _recv_exact(loop, conn, request.num_keys * KEY_BYTES)
        if raw is None:
            return False
        keys = p.split_keys(raw)
        if request.op == p.LOOKUP:
            held = await loop.run_in_executor(self._pool, self._lookup, keys)
            await loop.sock_sendall(conn, p.pack_answer(p.OK, len(keys)) + bytes(held))
            return True
        if self._streams >= self.config.max_streams:
            _BUSY.inc()
            await loop.sock_sendall(conn, p.pack_answer(p.BUSY, len(keys)))
            return True
        self._streams += 1
        try:
            await loop.sock_sendall(conn, p.pack_answer(p.OK, len(keys)))
            for key in keys:
                await self._send_chunk(loop, conn, key)
        finally:
            self._streams -= 1
        return True

    async def _send_chunk(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, key: ChunkKey
    ) -> None:
        outgoing = await loop.run_in_executor(self._pool, self._fetch, key)
        if outgoing is None:
            await loop.sock_sendall(conn, b"\x00")
            return
        await loop.sock_sendall(conn, b"\x01" + outgoing.header)
        await loop.sock_sendall(conn, outgoing.payload)
        _SERVED.inc()
        _SERVED_BYTES.inc(len(outgoing.payload))

    # -- tier access (on the thread pool) --------------------------------------------------
    def _lookup(self, keys: list[ChunkKey]) -> list[int]:
        held = [False] * len(keys)
        for tier in self.tiers:
            todo = [i for i, h in enumerate(held) if not h]
            if not todo:
                break
            for i, hit in zip(todo, tier.contains_many([keys[i] for i in todo]), strict=True):
                held[i] = hit
        return [int(h) for h in held]

    def _fetch(self, key: ChunkKey) -> Outgoing | None:
        for tier in self.tiers:
            chunk = tier.get(key)
            if chunk is None:
                continue
            if not chunk.is_contiguous() or chunk.device.type != "cpu":
                chunk = chunk.to("cpu").contiguous()
            payload = byte_view(chunk)
            return Outgoing(self._header(key, chunk, payload), payload, chunk)
        return None

    def _header(self, key: ChunkKey, chunk: torch.Tensor, payload: memoryview) -> bytes:
        """The chunk header (with the payload's checksum), computed once per chunk: a key names
        immutable content, so the header of a chunk sent before is still right."""
        slot = (key, dtype_name(chunk.dtype), tuple(chunk.shape))
        with self._lock:
            header = self._headers.get(slot)
        if header is None:
            header = encode_header(key, slot[1], slot[2], payload, len(payload))
            with self._lock:
                self._headers[slot] = header
                if len(self._headers) > HEADERS_KEPT:
                    self._headers.popitem(last=False)
        return header


async def _recv_exact(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, size: int
) -> bytearray | None:
    """``size`` bytes, or None if the peer closed the connection before sending any."""
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
