"""PeerServer: lends the chunks of an engine's local tiers (CPU, disk) to other engines.

asyncio with raw non-blocking sockets: payloads go from tier memory to the socket with
``sock_sendall`` (no copy into a transport buffer). Tier reads, checksums and MACs run on a
small thread pool, never on the event loop. At most ``max_streams`` GET answers stream at once;
a GET beyond that is answered BUSY immediately (back-pressure the asking engine turns into a
fallback), and TCP flow control paces each stream. Headers (with the payload checksum and, with
a cluster secret, the chunk MAC) of chunks already sent are remembered: chunks are immutable
under their content-addressed key.

Trust and bounds (:mod:`kvstack.cluster.peer_gate`): with a cluster secret a client proves it
holds it before any LOOKUP or GET; without one the server listens on loopback only unless
``security.insecure_no_auth``. Connections are capped per client address and in total. Every
read and every write has the ``timeout_s`` deadline, so a client that trickles a request or
stops reading an answer is cut off, and its stream slot and the CPU-tier leases of the chunks
being sent are freed with it.

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

from kvstack.cluster import peer_gate as gate
from kvstack.cluster.config import PeerServerConfig
from kvstack.kv.affinity import enter_background
from kvstack.kv.format import SIGNED_BYTES, encode_header, with_tag
from kvstack.kv.keys import KEY_BYTES, ChunkKey
from kvstack.kv.seal import ChunkSealer
from kvstack.kv.tensors import byte_view, dtype_name, torch
from kvstack.kv.tiers.peer import protocol as p
from kvstack.metrics import counter
from kvstack.security import SecurityConfig, check_bind

if TYPE_CHECKING:
    from kvstack.kv.cache import KVCache
    from kvstack.kv.tiers.base import Tier
    from kvstack.security import ClusterKeys

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
    def __init__(
        self,
        tiers: Sequence[Tier],
        config: PeerServerConfig | None = None,
        keys: ClusterKeys | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        self.tiers = list(tiers)
        self.config = config or PeerServerConfig()
        self.port = self.config.port
        self.keys = keys
        self.security = security or SecurityConfig()
        self._sealer = None if keys is None else ChunkSealer(keys)
        self._limits = gate.ConnectionLimits(
            self.config.max_connections, self.config.max_connections_per_peer
        )
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
    def for_cache(
        cls,
        cache: KVCache,
        config: PeerServerConfig | None = None,
        security: SecurityConfig | None = None,
    ) -> PeerServer:
        """Lend the cache's local tiers (shared stores are reachable by everyone anyway),
        authenticated with the cache's cluster keys."""
        return cls([t for t in cache.tiers if not t.shared], config, cache.keys, security)

    # -- lifecycle -------------------------------------------------------------------------
    def bind(self) -> int:
        """Open the listening socket (port 0: any free port); returns the port. Refuses a
        non-loopback address without a cluster secret (ConfigError), unless
        ``security.insecure_no_auth``."""
        check_bind(self.config.host, "the peer server", self.keys, self.security)
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
            conn, address = await loop.sock_accept(listener)
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._serve_connection(conn, str(address[0])))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_connection(self, conn: socket.socket, peer: str) -> None:
        timeout_s = self.config.timeout_s
        refusal = self._limits.acquire(peer)
        try:
            if refusal is not None:
                gate.refused("connections")
                await gate.turn_away(conn, refusal, timeout_s)
                return
            if not await gate.admit(conn, self.keys, timeout_s):
                return
            while True:
                try:  # between requests the deadline is an idle timeout: not a refusal
                    head = await gate.recv_exact(conn, p.REQUEST.size, timeout_s)
                except TimeoutError:
                    return
                if head is None or not await self._answer(conn, head):
                    return
        except TimeoutError:
            gate.refused("timeout")
            log.debug("peer connection from %s cut off: a read or write passed its deadline", peer)
        except (OSError, p.ProtocolError) as exc:
            log.debug("peer connection from %s closed: %r", peer, exc)
        finally:
            if refusal is None:
                self._limits.release(peer)
            conn.close()

    async def _refuse(self, conn: socket.socket, reason: str, message: str) -> bool:
        gate.refused(reason)
        data = message.encode()
        await gate.send(conn, p.pack_answer(p.BAD_REQUEST, len(data)) + data, self.config.timeout_s)
        return False

    async def _answer(self, conn: socket.socket, head: bytearray) -> bool:
        loop = asyncio.get_running_loop()
        timeout_s = self.config.timeout_s
        try:
            request = p.parse_request(head)
        except p.ProtocolError as exc:
            return await self._refuse(conn, "bad_request", str(exc))
        if request.num_keys > self.config.max_keys_per_request:
            message = f"{request.num_keys} keys > max_keys_per_request"
            return await self._refuse(conn, "too_many_keys", message)
        raw = await gate.recv_exact(conn, request.num_keys * KEY_BYTES, timeout_s)
        if raw is None:
            return False
        keys = p.split_keys(raw)
        if request.op == p.LOOKUP:
            held = await loop.run_in_executor(self._pool, self._lookup, keys)
            await gate.send(conn, p.pack_answer(p.OK, len(keys)) + bytes(held), timeout_s)
            return True
        if self._streams >= self.config.max_streams:
            _BUSY.inc()
            await gate.send(conn, p.pack_answer(p.BUSY, len(keys)), timeout_s)
            return True
        self._streams += 1
        try:
            await gate.send(conn, p.pack_answer(p.OK, len(keys)), timeout_s)
            for key in keys:
                await self._send_chunk(loop, conn, key)
        finally:
            self._streams -= 1
        return True

    async def _send_chunk(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, key: ChunkKey
    ) -> None:
        timeout_s = self.config.timeout_s
        outgoing = await loop.run_in_executor(self._pool, self._fetch, key)
        if outgoing is None:
            await gate.send(conn, b"\x00", timeout_s)
            return
        await gate.send(conn, b"\x01" + outgoing.header, timeout_s)
        await gate.send(conn, outgoing.payload, timeout_s)
        _SERVED.inc()
        _SERVED_BYTES.inc(len(outgoing.payload))

    @property
    def num_streams(self) -> int:
        """GET answers being sent now."""
        return self._streams

    @property
    def num_connections(self) -> int:
        return self._limits.num_open

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
        """The chunk header (with the payload's checksum, and its MAC with a secret), computed
        once per chunk: a key names immutable content, so the header of a chunk sent before is
        still right."""
        slot = (key, dtype_name(chunk.dtype), tuple(chunk.shape))
        with self._lock:
            header = self._headers.get(slot)
        if header is None:
            header = self._seal(key, slot[1], slot[2], payload)
            with self._lock:
                self._headers[slot] = header
                if len(self._headers) > HEADERS_KEPT:
                    self._headers.popitem(last=False)
        return header

    def _seal(
        self, key: ChunkKey, dtype: str, shape: tuple[int, ...], payload: memoryview
    ) -> bytes:
        if self._sealer is None:
            return encode_header(key, dtype, shape, payload, len(payload))
        fields, mac = self._sealer.begin_seal(key)
        header = encode_header(key, dtype, shape, payload, len(payload), seal=fields)
        mac.update(payload)
        return with_tag(header, mac.tag(header[:SIGNED_BYTES]))
