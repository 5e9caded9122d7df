"""``/v1/completions`` and ``/v1/chat/completions`` of the simulated engine.

One engine request per answer: a batch of prompts, each asked ``n`` times, becomes that many
requests (sharing their prompt's prefix blocks), streamed or answered together in vLLM's order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kvstack.sim.engine import SimEngine
from kvstack.sim.protocol import APIError, GenerateParams, bad_request, parse_chat, parse_completion
from kvstack.sim.render import DONE, Choice, Renderer
from kvstack.sim.request import Adapter, SimRequest

__all__ = ["error_response", "handle_generate", "not_found_model"]

_decode = msgspec.json.decode


def error_response(exc: APIError) -> Response:
    return Response(msgspec.json.encode(exc.body()), exc.status, media_type="application/json")


async def handle_generate(engine: SimEngine, request: Request, chat: bool) -> Response:
    try:
        params = _parse(engine, await request.body(), chat)
        adapter = _resolve_model(engine, params.model)
        limits = [_max_tokens(engine, params, prompt) for prompt in params.prompts]
    except APIError as exc:
        return error_response(exc)
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    choices = await _submit(engine, params, adapter, limits, request_id)
    renderer = Renderer(choices, params.model or engine.config.model, chat, int(time.time()),
                        request_id)  # fmt: skip
    headers = {"x-request-id": request_id}
    if params.stream:
        stream = _stream(engine, choices, renderer, params)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
    try:
        while not all(c.req.finished for c in choices):
            await _progress([c.req for c in choices])
    finally:
        for c in choices:
            engine.abort(c.req)  # a no-op once finished
    texts = [engine.tokenizer.decode(c.req.tokens[c.req.num_prompt :]) for c in choices]
    return Response(renderer.full(texts), media_type="application/json", headers=headers)


def _parse(engine: SimEngine, raw: bytes, chat: bool) -> GenerateParams:
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise APIError(
            400, f"1 validation error:\n  JSON decode error: {exc}", "Bad Request", "body"
        ) from None
    tok = engine.tokenizer
    return parse_chat(body, tok) if chat else parse_completion(body, tok)


def not_found_model(engine: SimEngine, model: str) -> APIError:
    return APIError(
        404,
        f"The model `{model}` does not exist. Valid aliases: {engine.config.model}.",
        "NotFoundError",
        "model",
    )


def _resolve_model(engine: SimEngine, model: str | None) -> Adapter | None:
    if model is None or model == engine.config.model:
        return None
    adapter = engine.loras.get(model) if engine.config.enable_lora else None
    if adapter is None:
        raise not_found_model(engine, model)
    return adapter


def _max_tokens(engine: SimEngine, params: GenerateParams, prompt: list[int]) -> int:
    limit = engine.config.max_model_len
    wanted = params.max_tokens
    if wanted is not None and wanted > limit:
        raise bad_request(
            f"max_tokens={wanted} cannot be greater than max_model_len={limit}. Please request "
            f"fewer output tokens. (parameter=max_tokens, value={wanted})",
            "max_tokens",
        )
    num = len(prompt)
    if num >= limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {num} input tokens, which exceeds this limit even without any output "
            "tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={num})",
            "input_tokens",
        )
    room = limit - num
    return room if wanted is None else min(wanted, room)


async def _submit(
    engine: SimEngine,
    params: GenerateParams,
    adapter: Adapter | None,
    limits: Sequence[int],
    request_id: str,
) -> list[Choice]:
    single = len(params.prompts) == 1 and params.n == 1
    choices = []
    for i, (prompt, max_tokens) in enumerate(zip(params.prompts, limits, strict=True)):
        for j in range(params.n):
            index = i * params.n + j
            name = request_id if single else f"{request_id}-{index}"
            req = await _make_request(engine, params, prompt, adapter, max_tokens, name)
            engine.submit(req)
            choices.append(Choice(index, req, j == 0))
    return choices


async def _make_request(
    engine: SimEngine,
    params: GenerateParams,
    prompt: list[int],
    adapter: Adapter | None,
    max_tokens: int,
    request_id: str,
) -> SimRequest:
    tier_hit = 0
    if engine.tier is not None:
        key = None if adapter is None else f"{adapter.name}@{adapter.path}"
        tier_hit = await engine.tier.lookup(prompt, key, params.cache_salt)
    return SimRequest(
        request_id=request_id,
        tokens=list(prompt),
        num_prompt=len(prompt),
        max_tokens=max_tokens,
        arrival_s=engine.now(),
        adapter=adapter,
        priority=params.priority,
        cache_salt=params.cache_salt,
        tier_hit_tokens=tier_hit,
        stream=params.stream,
    )


async def _progress(reqs: Sequence[SimRequest]) -> None:
    """Until the next step moves one of ``reqs`` on."""
    # The futures exist before this waits: a request finishing meanwhile still wakes it.
    waiters = [r.progress() for r in reqs if not r.finished]
    if waiters:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)


async def _stream(
    engine: SimEngine, choices: list[Choice], renderer: Renderer, params: GenerateParams
) -> AsyncIterator[bytes]:
    # As vLLM streams: nothing before a choice's first token (a chat stream's role chunk comes
    # with it, so the first body byte marks the end of the prefill), the first token at once,
    # then every ``stream_interval`` tokens and at the end.
    interval = engine.config.stream_interval
    sent = {c.index: 0 for c in choices}
    role_pending = {c.index for c in choices} if params.chat else set()
    try:
        while True:
            for choice in choices:
                for piece in _pieces(engine, choice, renderer, sent, role_pending, interval):
                    yield piece
            if all(c.req.finished for c in choices):
                break
            await _progress([c.req for c in choices])
        for choice in choices:
            if choice.index in role_pending:  # finished without a token
                yield renderer.role_chunk(choice)
        if params.include_usage:
            yield renderer.usage_chunk()
        yield DONE
    finally:
        for choice in choices:
            engine.abort(choice.req)  # a no-op once finished; frees the blocks of a client gone


def _pieces(
    engine: SimEngine,
    choice: Choice,
    renderer: Renderer,
    sent: dict[int, int],
    role_pending: set[int],
    interval: int,
) -> list[bytes]:
    req, done = choice.req, sent[choice.index]
    produced = req.num_output
    if not (produced > done and (req.finished or done == 0 or produced - done >= interval)):
        return []
    pieces = []
    if choice.index in role_pending:
        pieces.append(renderer.role_chunk(choice))
        role_pending.discard(choice.index)
    text = engine.tokenizer.decode(req.tokens[req.num_prompt + done : req.num_prompt + produced])
    pieces.append(renderer.chunk(choice, text, req.finished))
    sent[choice.index] = produced
    return pieces
