"""Client CPU per streamed request: aiohttp against httpx, on one simulated engine.

Why the load generator uses aiohttp: on the same machine as the fleet it measures, the
client's CPU per request is what limits the load it can offer.

    python benchmarks/client_overhead.py [--requests 2000] [--concurrency 32]

Starts ``kvstack sim-engine`` (time scale 1000, so the simulated model is never the limit),
sends the same streamed completion (4-token prompt, 8 tokens) with each client in turn, twice,
and prints the client's CPU microseconds per request and the requests per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import httpx

from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess

BODY = {"prompt": "t20 t21 t22 t23", "max_tokens": 8, "stream": True}


async def with_aiohttp(url: str, n: int, concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with sem, session.post(url + "/v1/completions", json=BODY) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        json.loads(line[6:])

        await asyncio.gather(*(one() for _ in range(n)))


async def with_httpx(url: str, n: int, concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as client:

        async def one() -> None:
            async with sem, client.stream("POST", url + "/v1/completions", json=BODY) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        json.loads(line[6:])

        await asyncio.gather(*(one() for _ in range(n)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "kvstack",
        "sim-engine",
        "--port",
        str(port),
        "--time-scale",
        "1000",
    ]
    with ManagedProcess("sim", argv, Path("/tmp/client-overhead-sim.log")) as proc:
        url = f"http://127.0.0.1:{port}"
        proc.wait_healthy(url + "/health", 60)
        for name, fn in [("aiohttp", with_aiohttp), ("httpx", with_httpx)] * 2:
            cpu, wall = time.process_time(), time.perf_counter()
            asyncio.run(fn(url, args.requests, args.concurrency))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(
                f"{name:>8}: {cpu / args.requests * 1e6:6.0f} us client CPU/request, "
                f"{args.requests / wall:6.0f} req/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
