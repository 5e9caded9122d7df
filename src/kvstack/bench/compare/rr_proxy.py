"""A tiny round-robin OpenAI proxy: the baseline front end of ``bench compare``.

    python -m kvstack.bench.compare.rr_proxy --port 9000 http://127.0.0.1:8100 http://127.0.0.1:8101

Each request goes to the next backend in turn; bodies and responses (streams included, chunk
by chunk) pass through unchanged. ``/health`` answers 200. No retries, no state: the point is
to be the simplest thing a router must beat.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import aiohttp
from aiohttp import web

__all__ = ["build_app", "main"]

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def build_app(backends: list[str]) -> web.Application:
    turn = itertools.cycle([b.rstrip("/") for b in backends])
    app = web.Application(client_max_size=64 * 1024 * 1024)
    session: dict[str, aiohttp.ClientSession] = {}

    async def start(_: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        session["s"] = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False
        )

    async def stop(_: web.Application) -> None:
        await session["s"].close()

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def forward(request: web.Request) -> web.StreamResponse:
        backend = next(turn)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        body = await request.read()
        async with session["s"].request(
            request.method, backend + request.path_qs, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_HEADERS:
                    response.headers[key] = value
            response.headers["x-kvstack-backend"] = backend
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvstack.bench.compare.rr_proxy", description=__doc__
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("backends", nargs="+", help="backend base URLs")
    args = p.parse_args(argv)
    web.run_app(
        build_app(args.backends), host=args.host, port=args.port, print=None, access_log=None
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
