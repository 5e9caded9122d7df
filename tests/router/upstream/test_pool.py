"""The lean upstream client against scripted raw HTTP servers: reuse, framing, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from kvstack.errors import UpstreamError
from kvstack.router.upstream.connection import ConnectionLostError
from kvstack.router.upstream.pool import Deadline, UpstreamPool, build_request

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Scripted:
    """Answers each request on a connection with ``respond(n, writer)`` (n counts requests)."""

    def __init__(self, respond: Callable[[int, asyncio.StreamWriter], object]) -> None:
        self.respond = respond
        self.num_connections = 0
        self.num_requests = 0
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.num_requests += 1
                result = self.respond(self.num_requests, writer)
                if asyncio.iscoroutine(result):
                    await result
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Scripted]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _roundtrip(pool: UpstreamPool, url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    raw = build_request("/v1/completions", "x", {"content-type": "application/json"}, b"{}")
    deadline = Deadline(timeout_s, "test")
    try:
        conn = await pool.request(url, raw, (deadline,))
        body = await conn.read_all()
    finally:
        deadline.cancel()
    pool.release(url, conn)
    return conn.status, body


async def test_keep_alive_connections_are_reused() -> None:
    async with Scripted(lambda n, w: w.write(OK)).running() as server:
        pool = UpstreamPool(1.0)
        for _ in range(20):
            assert await _roundtrip(pool, server.url) == (200, b"{}")
        assert server.num_connections == 1 and server.num_requests == 20
        pool.close()


async def test_connection_close_and_eof_framed_bodies_are_not_reused() -> None:
    def close_framed(n: int, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        w.close()

    async with Scripted(close_framed).running() as server:
        pool = UpstreamPool(1.0)
        assert await _roundtrip(pool, server.url) == (200, b"until the end")
        assert await _roundtrip(pool, server.url) == (200, b"until the end")
        assert server.num_connections == 2


async def test_chunked_bodies_are_decoded_and_streamed() -> None:
    async def chunked(n: int, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b"6\r\n world\r\n0\r\n\r\n")

    async with Scripted(chunked).running() as server:
        pool = UpstreamPool(1.0)
        raw = build_request("/", "x", {}, b"{}")
        deadline = Deadline(5, "test")
        conn = await pool.request(server.url, raw, (deadline,))
        assert await conn.read_chunk() == b"hello"
        assert not conn.complete
        assert await conn.read_chunk() == b" world"
        assert await conn.read_chunk() == b"" and conn.reusable
        deadline.cancel()


async def test_a_stale_keep_alive_connection_is_resent_once_on_a_fresh_one() -> None:
    def once_then_close(n: int, w: asyncio.StreamWriter) -> None:
        w.write(OK)
        w.close()  # closes after answering, without saying so: the pooled copy is stale

    async with Scripted(once_then_close).running() as server:
        pool = UpstreamPool(1.0)
        assert await _roundtrip(pool, server.url) == (200, b"{}")
        await asyncio.sleep(0.05)
        assert await _roundtrip(pool, server.url) == (200, b"{}")
        assert server.num_connections == 2 and server.num_requests == 2


async def test_a_deadline_aborts_the_request() -> None:
    async def never(n: int, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    async with Scripted(never).running() as server:
        pool = UpstreamPool(1.0)
        with pytest.raises(TimeoutError, match="test timeout"):
            await _roundtrip(pool, server.url, timeout_s=0.1)


async def test_connect_errors_and_dropped_connections() -> None:
    pool = UpstreamPool(0.5)
    with pytest.raises(UpstreamError) as err:
        await _roundtrip(pool, "http://127.0.0.1:9")  # nothing listens on the discard port
    assert err.value.kind == "connect"

    def drop(n: int, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        w.transport.abort()

    async with Scripted(drop).running() as server:
        with pytest.raises(ConnectionLostError) as lost:
            await _roundtrip(pool, server.url)
        assert not lost.value.before_response


def test_build_request_frames_the_body() -> None:
    raw = build_request("/v1/x", "h:1", {"a": "b"}, b"12345")
    assert raw == b"POST /v1/x HTTP/1.1\r\nhost: h:1\r\ncontent-length: 5\r\na: b\r\n\r\n12345"


async def test_an_interim_100_continue_is_skipped() -> None:
    def interim(n: int, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)

    async with Scripted(interim).running() as server:
        pool = UpstreamPool(1.0)
        assert await _roundtrip(pool, server.url) == (200, b"{}")
        assert await _roundtrip(pool, server.url) == (200, b"{}")
        assert server.num_connections == 1
