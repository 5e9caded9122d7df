"""A trivial, fast OpenAI-compatible upstream for measuring what a router adds.

It answers every completion with a canned body straight from an ``asyncio.Protocol`` (httptools
parses, no framework), so on loopback it costs a few tens of microseconds per request and the
router under test, not the upstream, dominates the measurement. It also answers what routers
probe on a worker: ``/health``, ``/v1/models``, ``/metrics`` (vLLM names), ``/get_server_info``
and ``/get_model_info``. ``stream: true`` gets a short SSE stream ending in ``data: [DONE]``.

Run it as ``python -m kvstack.bench.micro.router_upstream --port P [--port P2 ...] [--model NAME]``
(one process can listen on several ports, standing for several workers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

import httptools

__all__ = ["UpstreamProtocol", "main", "serve"]

log = logging.getLogger(__name__)

_COMPLETION = {
    "id": "cmpl-0",
    "object": "text_completion",
    "created": 0,
    "model": "",
    "choices": [{"index": 0, "text": " ok", "finish_reason": "length", "logprobs": None}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
}
_STREAM_CHUNKS = 4


def _response(status: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"".join(
        (
            b"HTTP/1.1 ",
            status,
            b"\r\ncontent-type: ",
            content_type,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n\r\n",
            body,
        )
    )


def _stream_response(model: str) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    parts = [head]
    for i in range(_STREAM_CHUNKS):
        event = {
            "id": "cmpl-0",
            "object": "text_completion",
            "model": model,
            "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
        }
        data = b"data: " + json.dumps(event).encode() + b"\n\n"
        parts.append(b"%x\r\n%s\r\n" % (len(data), data))
    done = b"data: [DONE]\n\n"
    parts.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    return b"".join(parts)


class _Canned:
    """Every response, rendered once."""

    def __init__(self, model: str) -> None:
        completion = dict(_COMPLETION, model=model)
        self.completion = _response(b"200 OK", json.dumps(completion).encode())
        self.stream = _stream_response(model)
        models = {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "x"}]}
        self.models = _response(b"200 OK", json.dumps(models).encode())
        self.health = _response(b"200 OK", b"")
        info = {"model_path": model, "served_model_name": model, "max_total_num_tokens": 65536}
        self.info = _response(b"200 OK", json.dumps(info).encode())
        metrics = (
            f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'
            f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\n'
            f'vllm:kv_cache_usage_perc{{model_name="{model}"}} 0.0\n'
        )
        self.metrics = _response(b"200 OK", metrics.encode(), b"text/plain; version=0.0.4")
        self.not_found = _response(b"404 Not Found", b'{"error": "not found"}')

    def for_request(self, method: bytes, path: bytes, body: bytes) -> bytes:
        if method == b"POST" and path.startswith(b"/v1/"):
            return (
                self.stream
                if b'"stream": true' in body or b'"stream":true' in body
                else (self.completion)
            )
        routes = {
            b"/health": self.health,
            b"/v1/models": self.models,
            b"/metrics": self.metrics,
            b"/get_server_info": self.info,
            b"/get_model_info": self.info,
        }
        return routes.get(path.split(b"?", 1)[0], self.not_found)


class UpstreamProtocol(asyncio.Protocol):
    """One keep-alive connection; requests are answered in order (pipelining works)."""

    def __init__(self, canned: _Canned, seen_paths: set[bytes] | None = None) -> None:
        self._canned = canned
        self._seen = seen_paths
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's class is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._seen is not None:
            self._seen.add(self._url)
        method = self._parser.get_method()
        out = self._canned.for_request(method, self._url, b"".join(self._body))
        if self._transport is not None:
            self._transport.write(out)


async def serve(
    host: str, ports: list[int], model: str, seen_paths: set[bytes] | None = None
) -> None:
    """Serve on every port until cancelled."""
    loop = asyncio.get_running_loop()
    canned = _Canned(model)
    servers = [
        await loop.create_server(
            lambda: UpstreamProtocol(canned, seen_paths), host, port, backlog=4096
        )
        for port in ports
    ]
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstack.bench.micro.router_upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, action="append", required=True)
    parser.add_argument("--model", default="fast-model")
    parser.add_argument("--log-paths", action="store_true", help="print each new path on stderr")
    args = parser.parse_args(argv)
    seen: set[bytes] | None = _PrintingSet() if args.log_paths else None
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        log.info("uvloop not installed; using the default event loop")
    try:
        asyncio.run(serve(args.host, args.port, args.model, seen))
    except KeyboardInterrupt:
        pass
    return 0


class _PrintingSet(set[bytes]):
    def add(self, item: bytes) -> None:
        if item not in self:
            print("path", item.decode(errors="replace"), file=sys.stderr, flush=True)
        super().add(item)


if __name__ == "__main__":
    sys.exit(main())
