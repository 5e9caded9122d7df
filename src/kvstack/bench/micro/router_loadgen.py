"""A lean HTTP/1.1 load generator: open loop at a fixed rate, or closed loop with N connections.

Each keep-alive connection is a bare ``asyncio.Protocol`` with httptools parsing the answer
(tens of microseconds per request, far below aiohttp's client), so on a shared 2-core machine
the generator takes little from the system under test. Open-loop latency is measured from the
*scheduled* send time (no coordinated omission: if the generator falls behind, that delay is
in the figures, and ``max_lag_ms`` says so). Run it as a separate process::

    python -m kvstack.bench.micro.router_loadgen --url http://127.0.0.1:8080/v1/completions \
        --rate 500 --duration-s 10 [--json out.json]
    python -m kvstack.bench.micro.router_loadgen --url ... --connections 64 --duration-s 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import httptools

from kvstack.bench.load.stats import percentile

__all__ = ["LoadResult", "closed_loop", "open_loop"]

DEFAULT_BODY = b'{"model": "fast-model", "prompt": "hello world", "max_tokens": 1}'


@dataclass
class LoadResult:
    mode: str
    duration_s: float
    num_ok: int = 0
    num_errors: int = 0
    max_lag_ms: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.num_ok / self.duration_s if self.duration_s else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "req_per_s": round(self.rate, 1),
            "ok": self.num_ok,
            "errors": self.num_errors,
            "p50_ms": self.latency_ms(50),
            "p90_ms": self.latency_ms(90),
            "p99_ms": self.latency_ms(99),
            "max_lag_ms": round(self.max_lag_ms, 3),
        }

    def latency_ms(self, q: float) -> float:
        """The ``q``-th latency percentile in ms, rounded to µs; NaN without a success."""
        value = percentile(self.latencies_ms, q)
        return float("nan") if value is None else round(value, 3)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[int] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's class differs

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(exc)

    def on_message_complete(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(self._parser.get_status_code())

    async def request(self, raw: bytes) -> int:
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return await self._waiter


class _Pool:
    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._idle: list[_Connection] = []

    async def take(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self._host, self._port)
        return conn

    def give(self, conn: _Connection) -> None:
        if not conn.closed:
            self._idle.append(conn)


def _raw_request(url: str, body: bytes) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return host, port, head.encode() + body


async def open_loop(
    url: str, rate: float, duration_s: float, body: bytes = DEFAULT_BODY
) -> LoadResult:
    host, port, raw = _raw_request(url, body)
    pool = _Pool(host, port)
    result = LoadResult("open", duration_s)
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter() + 0.05
    for i in range(int(rate * duration_s)):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            result.max_lag_ms = max(result.max_lag_ms, -delay * 1000)
        task = asyncio.create_task(_one(pool, raw, scheduled, result))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return result


async def _one(pool: _Pool, raw: bytes, scheduled: float, result: LoadResult) -> None:
    try:
        conn = await pool.take()
        status = await conn.request(raw)
    except (OSError, httptools.HttpParserError):
        result.num_errors += 1
        return
    pool.give(conn)
    if status == 200:
        result.num_ok += 1
        result.latencies_ms.append((time.perf_counter() - scheduled) * 1000)
    else:
        result.num_errors += 1


async def closed_loop(
    url: str, connections: int, duration_s: float, body: bytes = DEFAULT_BODY
) -> LoadResult:
    host, port, raw = _raw_request(url, body)
    result = LoadResult("closed", duration_s)
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        pool = _Pool(host, port)
        while time.perf_counter() < deadline:
            await _one(pool, raw, time.perf_counter(), result)

    await asyncio.gather(*(worker() for _ in range(connections)))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstack.bench.micro.router_loadgen")
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, help="open loop: requests per second")
    parser.add_argument("--connections", type=int, help="closed loop: concurrent connections")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--json", help="write the summary (and latencies) here")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.rate:
        result = asyncio.run(open_loop(args.url, args.rate, args.duration_s))
    else:
        result = asyncio.run(closed_loop(args.url, args.connections or 32, args.duration_s))
    summary = result.summary()
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, **asdict(result)}, f)
    return 0 if result.num_ok else 1


if __name__ == "__main__":
    sys.exit(main())
