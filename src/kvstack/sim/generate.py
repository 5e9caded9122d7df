"""``/v1/completions`` and ``/v1/chat/completions`` of the simulated engine."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kvstack.sim.engine import SimEngine
from kvstack.sim.protocol import APIError, GenerateParams, bad_request, parse_chat, parse_completion
from kvstack.sim.render import DONE, Renderer
from kvstack.sim.request import Adapter, SimRequest

__all__ = ["error_response", "handle_generate"]

_decode = msgspec.json.decode


def error_response(exc: APIError) -> Response:
    return Response(msgspec.json.encode(exc.body()), exc.status, media_type="application/json")


async def handle_generate(engine: SimEngine, request: Request, chat: bool) -> Response:
    try:
        raw = await request.body()
        try:
            body = _decode(raw)
        except msgspec.DecodeError as exc:
            raise bad_request(f"the request body is not valid JSON: {exc}") from None
        tok = engine.tokenizer
        params = parse_chat(body, tok) if chat else parse_completion(body, tok)
        adapter = _resolve_model(engine, params.model)
        max_tokens = _max_tokens(engine, params)
    except APIError as exc:
        return error_response(exc)
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    req = await _make_request(engine, params, adapter, max_tokens, request_id)
    engine.submit(req)
    renderer = Renderer(req, params.model or engine.config.model, chat, int(time.time()))
    headers = {"x-request-id": request_id}
    if params.stream:
        stream = _stream(engine, req, renderer, params)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
    while not req.finished:
        await req.wait_for_progress()
    text = engine.tokenizer.decode(req.tokens[req.num_prompt :])
    return Response(renderer.full(text), media_type="application/json", headers=headers)


def _resolve_model(engine: SimEngine, model: str | None) -> Adapter | None:
    if model is None or model == engine.config.model:
        return None
    adapter = engine.loras.get(model) if engine.config.enable_lora else None
    if adapter is None:
        raise APIError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {engine.config.model}.",
            "NotFoundError",
            "model",
        )
    return adapter


def _max_tokens(engine: SimEngine, params: GenerateParams) -> int:
    limit = engine.config.max_model_len
    num = len(params.prompt_tokens)
    if num >= limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {num} input tokens, which exceeds this limit even without any output "
            "tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={num})",
            "input_tokens",
        )
    room = limit - num
    return room if params.max_tokens is None else min(params.max_tokens, room)


async def _make_request(
    engine: SimEngine,
    params: GenerateParams,
    adapter: Adapter | None,
    max_tokens: int,
    request_id: str,
) -> SimRequest:
    tier_hit = 0
    if engine.tier is not None:
        key = None if adapter is None else f"{adapter.name}@{adapter.path}"
        tier_hit = await engine.tier.lookup(params.prompt_tokens, key, params.cache_salt)
    return SimRequest(
        request_id=request_id,
        tokens=list(params.prompt_tokens),
        num_prompt=len(params.prompt_tokens),
        max_tokens=max_tokens,
        arrival_s=engine.now(),
        adapter=adapter,
        priority=params.priority,
        cache_salt=params.cache_salt,
        tier_hit_tokens=tier_hit,
        stream=params.stream,
    )


async def _stream(
    engine: SimEngine, req: SimRequest, renderer: Renderer, params: GenerateParams
) -> AsyncIterator[bytes]:
    # As vLLM streams: nothing before the first token (a chat stream's role chunk comes with
    # it, so the first body byte marks the end of the prefill), the first token at once, then
    # every ``stream_interval`` tokens and at the end.
    interval = engine.config.stream_interval
    decode = engine.tokenizer.decode
    sent = 0
    role_pending = params.chat
    try:
        while True:
            produced = req.num_output
            if produced > sent and (req.finished or sent == 0 or produced - sent >= interval):
                if role_pending:
                    yield renderer.role_chunk()
                    role_pending = False
                start = req.num_prompt + sent
                yield renderer.chunk(
                    decode(req.tokens[start : req.num_prompt + produced]), req.finished
                )
                sent = produced
            if req.finished:
                break
            await req.wait_for_progress()
        if role_pending:  # finished without a token
            yield renderer.role_chunk()
        if params.include_usage:
            yield renderer.usage_chunk()
        yield DONE
    finally:
        engine.abort(req)  # a no-op once finished; frees the blocks of a client that left
