"""The simulated engine's HTTP API (Starlette): vLLM's OpenAI routes and admin routes.

``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``, ``/version``,
``/metrics``, ``/tokenize``, ``/detokenize``, ``/reset_prefix_cache``, and, with LoRA enabled,
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` with vLLM's checks, messages and
status codes (400 missing field, name taken, name of the base model; 404 unknown adapter or
missing path). ``x-request-id`` names the request (``cmpl-<id>``) and is echoed back. With an
``api_key``, ``/v1`` routes need it, as vLLM's (:mod:`kvstack.sim.auth`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from typing import Any, cast

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kvstack.sim.auth import ApiKeyMiddleware
from kvstack.sim.engine import SimEngine
from kvstack.sim.generate import error_response, handle_generate, not_found_model
from kvstack.sim.protocol import APIError, bad_request
from kvstack.sim.request import Adapter
from kvstack.sim.tokenizer import ChatError
from kvstack.sim.validation import ChatTokenizeBody, DetokenizeBody, TokenizeBody, read_body

__all__ = ["VLLM_VERSION", "build_app"]

VLLM_VERSION = "0.32.0"
_encode = msgspec.json.encode


def _json(body: Any, status: int = 200) -> Response:
    return Response(_encode(body), status, media_type="application/json")


def build_app(engine: SimEngine) -> Starlette:
    created = int(time.time())
    lora_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def completions(request: Request) -> Response:
        return await handle_generate(engine, request, chat=False)

    async def chat(request: Request) -> Response:
        return await handle_generate(engine, request, chat=True)

    async def models(request: Request) -> Response:
        return _json(_model_list(engine, created))

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return _json({"version": VLLM_VERSION})

    async def metrics(request: Request) -> Response:
        return Response(engine.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    async def tokenize(request: Request) -> Response:
        return await _tokenize(engine, request)

    async def detokenize(request: Request) -> Response:
        return await _detokenize(engine, request)

    async def reset_prefix_cache(request: Request) -> Response:
        if engine.reset_prefix_cache():
            return Response(status_code=200)
        return error_response(bad_request("Failed to reset prefix cache: requests are running"))

    async def load_lora(request: Request) -> Response:
        return await _load_lora(engine, request, lora_locks)

    async def unload_lora(request: Request) -> Response:
        return await _unload_lora(engine, request)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
    ]
    if engine.config.enable_lora:  # vLLM registers these only when runtime updates are on
        routes += [
            Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
            Route("/v1/unload_lora_adapter", unload_lora, methods=["POST"]),
        ]
    key = engine.config.api_key
    guard = [] if key is None else [Middleware(ApiKeyMiddleware, api_key=key.get_secret_value())]
    # As vLLM's FastAPI app answers a path or method it has no route for: FastAPI's own body.
    return Starlette(
        routes=routes, middleware=guard, exception_handlers={HTTPException: _http_error}
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    http = cast(HTTPException, exc)  # registered for HTTPException only
    return _json({"detail": http.detail}, http.status_code)


def _permission(created: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"modelperm-{os.urandom(8).hex()}",
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
    ]


def _model_list(engine: SimEngine, created: int) -> dict[str, Any]:
    base = engine.config.model
    card = {"object": "model", "created": created, "owned_by": "vllm"}
    data = [
        card | {"id": base, "root": base, "parent": None,
                "max_model_len": engine.config.max_model_len, "permission": _permission(created)}
    ]  # fmt: skip
    for adapter in engine.loras.registered.values():
        data.append(
            card | {"id": adapter.name, "root": adapter.path, "parent": base,
                    "max_model_len": None, "permission": _permission(created)}
        )  # fmt: skip
    return {"object": "list", "data": data}


async def _json_body(request: Request) -> dict[str, Any]:
    body = _decode_json(await request.body())
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", "Bad Request", "body")
    return body


async def _tokenize(engine: SimEngine, request: Request) -> Response:
    try:
        body = _decode_json(await request.body())
        tok = engine.tokenizer
        if isinstance(body, dict) and "messages" in body:
            chat = read_body(ChatTokenizeBody, body)
            _check_model(engine, chat.model)
            messages = [m.model_dump() for m in chat.messages]
            tokens = tok.apply_chat_template(messages, chat.add_generation_prompt)
        else:
            plain = read_body(TokenizeBody, body)
            _check_model(engine, plain.model)
            tokens = tok.encode(plain.prompt)
    except ChatError as exc:
        return error_response(bad_request(str(exc), "messages"))
    except APIError as exc:
        return error_response(exc)
    return _json(
        {"count": len(tokens), "max_model_len": engine.config.max_model_len,
         "tokens": tokens, "token_strs": None}
    )  # fmt: skip


async def _detokenize(engine: SimEngine, request: Request) -> Response:
    try:
        body = read_body(DetokenizeBody, _decode_json(await request.body()))
        _check_model(engine, body.model)
        tokens = engine.tokenizer.check_ids(body.tokens)
    except ValueError as exc:
        return error_response(bad_request(str(exc)))
    except APIError as exc:
        return error_response(exc)
    return _json({"prompt": engine.tokenizer.decode(tokens)})


def _decode_json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise APIError(
            400, f"1 validation error:\n  JSON decode error: {exc}", "Bad Request", "body"
        ) from None


def _check_model(engine: SimEngine, model: str | None) -> None:
    """vLLM's 404 for a model it does not serve (the base model or a loaded adapter)."""
    if model is None or model == engine.config.model:
        return
    if engine.config.enable_lora and engine.loras.get(model) is not None:
        return
    raise not_found_model(engine, model)


def _missing(field: str) -> APIError:
    return APIError(400, f"Field required: body.{field}", "Bad Request", f"body.{field}")


def _invalid(message: str) -> APIError:
    return APIError(400, message, "InvalidUserInput")


async def _load_lora(
    engine: SimEngine, request: Request, locks: defaultdict[str, asyncio.Lock]
) -> Response:
    try:
        body = await _json_body(request)
        for field in ("lora_name", "lora_path"):
            if field not in body:
                raise _missing(field)
        name, path = body["lora_name"], body["lora_path"]
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            raise _invalid("Both 'lora_name' and 'lora_path' must be provided.")
    except APIError as exc:
        return error_response(exc)
    async with locks[name]:  # one load per name at a time, as vLLM
        return await _load_locked(engine, body, name, path)


async def _load_locked(engine: SimEngine, body: dict[str, Any], name: str, path: str) -> Response:
    try:
        if name == engine.config.model:
            raise _invalid(f"The lora adapter '{name}' conflicts with a served base model.")
        if name in engine.loras.registered and not body.get("load_inplace", False):
            raise _invalid(
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True."
            )
        if engine.config.lora_check_path and not await asyncio.to_thread(os.path.exists, path):
            raise APIError(
                404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError"
            )
    except APIError as exc:
        return error_response(exc)
    await asyncio.sleep(engine.clock.wall_s(engine.config.lora_load_s))
    engine.loras.register(Adapter(name, path, engine.loras.next_id(name)))
    return Response(f"Success: LoRA adapter '{name}' added successfully.", 200)


async def _unload_lora(engine: SimEngine, request: Request) -> Response:
    try:
        body = await _json_body(request)
        name = body.get("lora_name")
        if not name or not isinstance(name, str):
            raise _invalid("'lora_name' needs to be provided to unload a LoRA adapter.")
        if not engine.loras.unregister(name):
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
    except APIError as exc:
        return error_response(exc)
    return Response(f"Success: LoRA adapter '{name}' removed successfully.", 200)
