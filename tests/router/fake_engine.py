"""A small fake OpenAI engine on a real loopback socket, with knobs for failure tests.

Answers ``/v1/completions`` and ``/v1/chat/completions`` (streaming or not) with its own name
in the text, so a test sees which backend served; ``/v1/models`` (models and adapters),
``/health`` and ``/metrics`` (vLLM names). Knobs: ``delay_s`` before answering, ``fail_next``
(answer N requests with ``fail_status``), ``healthy``, ``chunk_delay_s`` between stream chunks,
``hang`` (never answer; records the disconnect), and the metric values.

In-process: ``async with FakeEngine(...).running() as engine``. As a process:
``python -m tests.router.fake_engine --port P --name N --model M``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvstack.stack.ports import free_port


@dataclass
class Seen:
    path: str  # with the query, for the routes the echo handler answers
    body: dict[str, Any]
    headers: dict[str, str]
    method: str = "POST"
    raw: bytes = b""


@dataclass
class FakeEngine:
    name: str = "engine"
    models: list[str] = field(default_factory=lambda: ["toy"])
    adapters: dict[str, str] = field(default_factory=dict)  # adapter -> base
    port: int = 0
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    num_chunks: int = 3
    fail_next: int = 0
    fail_status: int = 500
    healthy: bool = True
    hang: bool = False
    break_after: int | None = None  # stream chunks before dropping the connection
    running_requests: float = 0.0
    waiting_requests: float = 0.0
    kv_usage: float = 0.0
    running_adapters: list[str] = field(default_factory=list)  # vllm:lora_requests_info
    max_loras: int = 4
    seen: list[Seen] = field(default_factory=list)
    disconnects: int = 0
    in_progress: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_route("*", "/{tail:.*}", self._echo)  # every other route of vLLM's
        return app

    async def start(self) -> FakeEngine:
        self.port = self.port or free_port()
        self._runner = web.AppRunner(self.app(), handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeEngine]:
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "owned_by": self.name} for m in self.models]
        data += [
            {"id": a, "object": "model", "owned_by": self.name, "parent": base}
            for a, base in self.adapters.items()
        ]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        model = self.models[0] if self.models else "none"
        text = (
            f'vllm:num_requests_running{{model_name="{model}"}} {self.running_requests}\n'
            f'vllm:num_requests_waiting{{model_name="{model}"}} {self.waiting_requests}\n'
            f'vllm:kv_cache_usage_perc{{model_name="{model}"}} {self.kv_usage}\n'
        )
        if self.running_adapters:
            running = ",".join(self.running_adapters)
            text += (
                f'vllm:lora_requests_info{{max_lora="{self.max_loras}",'
                f'running_lora_adapters="{running}",waiting_lora_adapters=""}} 1\n'
            )
        return web.Response(text=text, content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(
            Seen(request.path_qs, body, {k.lower(): v for k, v in request.headers.items()})
        )
        self.in_progress += 1
        try:
            return await self._answer(request, body)
        finally:
            self.in_progress -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.hang:
            return await self._hang(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response({"error": {"message": "boom"}}, status=self.fail_status)
        known = set(self.models) | set(self.adapters)
        if body.get("model") not in known:
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        if body.get("stream"):
            return await self._stream(request, body)
        return web.json_response(self._completion(body, f"from {self.name}"))

    def _completion(self, body: dict[str, Any], text: str, done: bool = True) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop" if done else None}
        if "messages" in body:
            key = "delta" if body.get("stream") else "message"
            choice[key] = {"role": "assistant", "content": text}
            kind = "chat.completion.chunk" if body.get("stream") else "chat.completion"
        else:
            choice["text"] = text
            kind = "text_completion"
        return {
            "id": f"cmpl-{self.name}",
            "object": kind,
            "created": int(time.time()),
            "model": body["model"],
            "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i in range(self.num_chunks):
                if i and self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                if self.break_after is not None and i == self.break_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                last = i == self.num_chunks - 1
                event = self._completion(body, f"{self.name}:{i} ", done=last)
                await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        return response

    async def _echo(self, request: web.Request) -> web.Response:
        """Any other route: recorded, and answered with what arrived."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw and request.content_type == "application/json" else {}
        except ValueError:
            body = {}
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.seen.append(Seen(request.path_qs, body, headers, request.method, raw))
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response({"error": {"message": "boom"}}, status=self.fail_status)
        echo = {"engine": self.name, "method": request.method, "path": request.path_qs}
        return web.json_response({"echo": echo, "model": body.get("model")})

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses``: an answer with a fresh response id (streamed or not)."""
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.seen.append(Seen(request.path_qs, body, headers))
        response = {"id": f"resp_{self.name}{len(self.seen)}", "object": "response",
                    "model": body.get("model"), "engine": self.name}  # fmt: skip
        if not body.get("stream"):
            return web.json_response(response)
        stream = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await stream.prepare(request)
        created = {"type": "response.created", "response": response}
        await stream.write(b"event: response.created\ndata: " + json.dumps(created).encode())
        await stream.write(b"\n\nevent: response.completed\ndata: {}\n\n")
        return stream

    async def _hang(self, request: web.Request) -> web.Response:
        # aiohttp gives a handler no disconnect event; the transport state is all there is.
        while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        self.disconnects += 1
        return web.Response(status=499)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="engine")
    parser.add_argument("--model", action="append", default=None)
    parser.add_argument("--adapter", action="append", default=[], help="NAME=BASE")
    parser.add_argument("--delay-s", type=float, default=0.0)
    parser.add_argument("--chunk-delay-s", type=float, default=0.0)
    parser.add_argument("--num-chunks", type=int, default=3)
    args = parser.parse_args()
    engine = FakeEngine(
        name=args.name,
        models=args.model or ["toy"],
        adapters=dict(a.split("=", 1) for a in args.adapter),
        port=args.port,
        delay_s=args.delay_s,
        chunk_delay_s=args.chunk_delay_s,
        num_chunks=args.num_chunks,
    )
    web.run_app(engine.app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
