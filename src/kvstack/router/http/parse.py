"""Parse a completions or chat request: only the fields routing needs, checked as OpenAI does.

A :class:`~kvstack.errors.RequestError` renders as an OpenAI-style 400; every other field is
left for the backend and forwarded unchanged.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from kvstack.errors import RequestError
from kvstack.router.request import PRIORITY_HEADER, REQUEST_ID_HEADER, Endpoint, RoutingRequest

if TYPE_CHECKING:
    from kvstack.router.tenancy import Tenancy

__all__ = ["parse_request"]

# Request ids: a per-process random prefix and a counter (uuid4 per request costs more).
_ID_PREFIX = os.urandom(6).hex()
_ids = itertools.count(1)
_decoder = msgspec.json.Decoder()


def parse_request(
    endpoint: Endpoint,
    raw: bytes,
    headers: Mapping[str, str],
    *,
    session_header: str = "x-session-id",
    tenant: str | None = None,
    arrival_s: float | None = None,
    tenancy: Tenancy | None = None,
) -> RoutingRequest:
    """Parse and check a completions or chat body; raise :class:`RequestError` (400).
    ``tenancy`` adjusts the tenant's fields (salt, priority cap, privilege) on the way."""
    body = _decode_object(raw)
    priority = headers.get(PRIORITY_HEADER)
    privileged = False
    if tenancy is not None:
        body, priority, privileged = tenancy.adjust(body, headers, tenant, priority)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("you must provide a model parameter", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be a boolean, got {stream!r}", param="stream")
    max_tokens = _optional_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens")
    prompt, messages, token_ids = _inputs(endpoint, body)
    user = body.get("user")
    user = user if isinstance(user, str) and user else None
    return RoutingRequest(
        request_id=headers.get(REQUEST_ID_HEADER) or f"{_ID_PREFIX}-{next(_ids)}",
        endpoint=endpoint,
        model=model,
        target=model,
        prompt=prompt,
        messages=messages,
        token_ids=token_ids,
        stream=stream,
        max_tokens=max_tokens,
        priority=priority,
        session_id=headers.get(session_header) or user,
        user=user,
        tenant=tenant,
        privileged=privileged,
        headers=headers,
        body=body,
        arrival_s=time.perf_counter() if arrival_s is None else arrival_s,
    )


def _decode_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise RequestError("the request body is empty; send a JSON object", code="invalid_json")
    try:
        body = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise RequestError(
            f"We could not parse the JSON body of your request ({exc})", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise RequestError(
            f"the request body must be a JSON object, got {type(body).__name__}",
            code="invalid_json",
        )
    return body


def _optional_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"'{name}' must be a non-negative integer, got {value!r}", param=name)
    return value


def _inputs(
    endpoint: Endpoint, body: Mapping[str, Any]
) -> tuple[str | list[Any] | None, list[dict[str, Any]] | None, list[int] | None]:
    if endpoint == "chat":
        return None, _messages(body.get("messages")), None
    prompt = body.get("prompt")
    if prompt is None:
        raise RequestError("you must provide a prompt parameter", param="prompt")
    if isinstance(prompt, str):
        return prompt, None, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return prompt, None, list(prompt)
        if all(isinstance(p, str) for p in prompt) or all(_is_token_list(p) for p in prompt):
            return prompt, None, None
    raise RequestError(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of lists "
        "of token ids",
        param="prompt",
    )


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _messages(value: object) -> list[dict[str, Any]]:
    if value is None:
        raise RequestError("you must provide a messages parameter", param="messages")
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty array", param="messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(
                f"messages[{i}] must be an object with a string 'role'", param=f"messages.{i}"
            )
    return value
