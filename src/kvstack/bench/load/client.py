"""One streamed OpenAI request, timed: time to first token, gaps between chunks, end to end.

aiohttp, not httpx: against a simulated engine on 2 cores, a streamed request cost ~0.19 ms
of client CPU with aiohttp and ~3.1 ms with httpx (``benchmarks/client_overhead.py``), and
the load generator shares the machine with the fleet it measures.

TTFT is the time to the first chunk carrying text (a chat stream's role chunk carries none);
inter-token latencies are the gaps between text chunks (several tokens in one chunk make one
gap, as in ``vllm bench serve``); token counts come from the final usage chunk.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import msgspec

from kvstack.bench.workloads.base import RequestSpec

__all__ = ["RequestResult", "StreamClient"]

_decode = msgspec.json.decode


@dataclass(slots=True)
class RequestResult:
    start_s: float  # since the run started
    scheduled_s: float | None = None  # open loop: the planned arrival offset
    ok: bool = False
    status: int = 0  # HTTP status; 0 when no response (connection error, timeout)
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    expected_prompt_tokens: int | None = None
    priority: str = "standard"
    adapter: str | None = None
    tenant: str | None = None
    backend: str | None = None
    text: str = ""

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def record(self) -> dict[str, Any]:
        """A JSON-ready dict (without the generated text)."""
        out = asdict(self)
        del out["text"]
        out["tpot_s"] = self.tpot_s
        return out


class StreamClient:
    """A pooled aiohttp session against one OpenAI-compatible base URL."""

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamClient:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def get_json(self, path: str) -> Any:
        assert self._session is not None
        async with self._session.get(self.base_url + path) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def send(self, spec: RequestSpec, model: str, t0: float) -> RequestResult:
        """Send ``spec`` and time it; never raises for HTTP or network failures."""
        assert self._session is not None
        start = time.perf_counter()
        result = RequestResult(
            start_s=start - t0,
            expected_prompt_tokens=spec.expected_prompt_tokens,
            priority=spec.priority,
            adapter=spec.adapter,
            tenant=spec.tenant,
        )
        path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        headers = {"x-kvstack-priority": spec.priority}
        if spec.session:
            headers["x-session-id"] = spec.session
        try:
            async with self._session.post(
                self.base_url + path, json=spec.body(model), headers=headers
            ) as resp:
                result.status = resp.status
                result.backend = resp.headers.get("x-kvstack-backend")
                if resp.status != 200:
                    result.error = _error_message(await resp.read())
                    return result
                await _read_stream(resp, result, start)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            return result
        result.e2e_s = time.perf_counter() - start
        result.ok = result.ttft_s is not None and result.error is None
        return result


async def _read_stream(resp: aiohttp.ClientResponse, result: RequestResult, start: float) -> None:
    parts: list[str] = []
    last = 0.0
    async for line in resp.content:
        if not line.startswith(b"data: {"):
            continue
        chunk = _decode(line[6:])
        if "error" in chunk:
            result.error = str(chunk["error"].get("message", chunk["error"]))
            continue
        text = _chunk_text(chunk)
        if text:
            now = time.perf_counter()
            if result.ttft_s is None:
                result.ttft_s = now - start
            else:
                result.itl_s.append(now - last)
            last = now
            parts.append(text)
        usage = chunk.get("usage")
        if usage:
            result.output_tokens = usage.get("completion_tokens", 0)
            result.prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            result.cached_tokens = details.get("cached_tokens")
    result.text = "".join(parts)
    if not result.output_tokens:  # no usage chunk: count text chunks
        result.output_tokens = len(result.itl_s) + (result.ttft_s is not None)


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices")
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return str(choice["delta"].get("content") or "")
    return str(choice.get("text") or "")


def _error_message(raw: bytes) -> str:
    try:
        body = _decode(raw)
    except msgspec.DecodeError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))[:300]
    return str(body)[:300]
