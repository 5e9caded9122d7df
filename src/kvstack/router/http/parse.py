"""Parse a request body: only the fields routing needs, read the way vLLM reads them.

The router refuses only what it cannot route: a body that is not a JSON object (or a form, for
the audio routes) and a request without a model. Every other field is read leniently (as
vLLM's pydantic models read them: ``"stream": 1`` is true, ``"max_tokens": "8"`` is 8) and, when
routing cannot use it, left for the engine, whose own vLLM error then reaches the client
unchanged. So the router never refuses a request vLLM would serve.

Generation routes have their prompt read for prefix-aware routing: completions' ``prompt``,
chat's ``messages``, and the Responses and Anthropic Messages prompts rendered as the chat
conversations vLLM renders (:mod:`kvstack.router.http.conversations`).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from pydantic import TypeAdapter, ValidationError

from kvstack.errors import RequestError
from kvstack.router.admission.config import PRIORITIES
from kvstack.router.http.conversations import (
    anthropic_messages,
    batch_messages,
    responses_messages,
)
from kvstack.router.http.forms import form_fields
from kvstack.router.request import (
    GENERATION_ENDPOINTS,
    PRIORITY_HEADER,
    REQUEST_ID_HEADER,
    Endpoint,
    RoutingRequest,
)

if TYPE_CHECKING:
    from kvstack.router.tenancy import Tenancy

__all__ = ["new_request_id", "parse_form_request", "parse_request"]

# Request ids: a per-process random prefix and a counter (uuid4 per request costs more).
_ID_PREFIX = os.urandom(6).hex()
_ids = itertools.count(1)
_decoder = msgspec.json.Decoder()
_LAX_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_LAX_INT: TypeAdapter[int] = TypeAdapter(int)
BAD_REQUEST = "Bad Request"  # vLLM's type for a body its request model rejects

Inputs = tuple[str | list[Any] | None, list[dict[str, Any]] | None, list[int] | None]


def new_request_id(headers: Mapping[str, str]) -> str:
    return headers.get(REQUEST_ID_HEADER) or f"{_ID_PREFIX}-{next(_ids)}"


def parse_request(
    endpoint: Endpoint,
    raw: bytes,
    headers: Mapping[str, str],
    *,
    session_header: str = "x-session-id",
    tenant: str | None = None,
    arrival_s: float | None = None,
    route_path: str = "",
    tenancy: Tenancy | None = None,
) -> RoutingRequest:
    """Parse a JSON body; RequestError (400) when it is not an object or names no model.
    ``tenancy`` adjusts the tenant's fields (salt, priority cap, privilege) on the way, and
    drops engine controls the caller may not send."""
    body = _decode_object(raw)
    if tenancy is not None:
        body = tenancy.engine_fields(body, headers)
    prompt, messages, token_ids = _inputs(endpoint, body)
    return _request(
        endpoint, body, headers, prompt, messages, token_ids,
        session_header=session_header, tenant=tenant, arrival_s=arrival_s,
        route_path=route_path, tenancy=tenancy,
    )  # fmt: skip


def parse_form_request(
    raw: bytes,
    headers: Mapping[str, str],
    *,
    route_path: str,
    session_header: str = "x-session-id",
    tenant: str | None = None,
    arrival_s: float | None = None,
    tenancy: Tenancy | None = None,
) -> RoutingRequest:
    """Parse a ``multipart/form-data`` body (the audio routes): its small text fields."""
    fields = form_fields(raw, headers.get("content-type", ""))
    body: dict[str, Any] = dict(fields.values)
    return _request(
        "other", body, headers, None, None, None,
        session_header=session_header, tenant=tenant, arrival_s=arrival_s,
        route_path=route_path, tenancy=tenancy,
    )  # fmt: skip


def _request(
    endpoint: Endpoint,
    body: dict[str, Any],
    headers: Mapping[str, str],
    prompt: str | list[Any] | None,
    messages: list[dict[str, Any]] | None,
    token_ids: list[int] | None,
    *,
    session_header: str,
    tenant: str | None,
    arrival_s: float | None,
    route_path: str,
    tenancy: Tenancy | None,
) -> RoutingRequest:
    priority = _priority(headers)
    privileged = False
    if tenancy is not None:  # a salt only where vLLM caches a prompt: the generation routes
        salted = endpoint in GENERATION_ENDPOINTS
        body, priority, privileged = tenancy.adjust(body, headers, tenant, priority, salted)
    user = body.get("user")
    user = user if isinstance(user, str) and user else None
    model = _model(body)
    return RoutingRequest(
        request_id=new_request_id(headers),
        endpoint=endpoint,
        model=model,
        target=model,
        prompt=prompt,
        messages=messages,
        token_ids=token_ids,
        stream=_lax(_LAX_BOOL, body.get("stream")) is True,
        max_tokens=_max_tokens(endpoint, body),
        priority=priority,
        session_id=headers.get(session_header) or user,
        user=user,
        tenant=tenant,
        privileged=privileged,
        headers=headers,
        body=body,
        arrival_s=time.perf_counter() if arrival_s is None else arrival_s,
        route_path=route_path,
    )


def _decode_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise RequestError(
            "the request body is empty; send a JSON object", param="body",
            code="invalid_json", kind=BAD_REQUEST,
        )  # fmt: skip
    try:
        body = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise RequestError(
            f"We could not parse the JSON body of your request ({exc})", param="body",
            code="invalid_json", kind=BAD_REQUEST,
        ) from None  # fmt: skip
    if not isinstance(body, dict):
        raise RequestError(
            f"the request body must be a JSON object, got {type(body).__name__}", param="body",
            code="invalid_json", kind=BAD_REQUEST,
        )  # fmt: skip
    return body


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if model is None or model == "":
        raise RequestError("you must provide a model parameter", param="model", code="no_model")
    if not isinstance(model, str):
        raise RequestError(
            f"'model' must be a string, got {model!r}", param="body.model", kind=BAD_REQUEST
        )
    return model


def _lax(adapter: TypeAdapter[Any], value: object) -> Any:
    """``value`` as vLLM's request models coerce it; None where they would refuse it (the
    engine then says so in its own words)."""
    if value is None:
        return None
    try:
        return adapter.validate_python(value)
    except ValidationError:
        return None


def _max_tokens(endpoint: Endpoint, body: Mapping[str, Any]) -> int | None:
    names = {"responses": ("max_output_tokens",)}.get(
        endpoint, ("max_completion_tokens", "max_tokens")
    )
    for name in names:
        value = _lax(_LAX_INT, body.get(name))
        if isinstance(value, int) and value >= 0:
            return value
    return None


def _inputs(endpoint: Endpoint, body: Mapping[str, Any]) -> Inputs:
    if endpoint == "completions":
        return _completion_prompt(body.get("prompt"))
    if endpoint == "chat":
        return None, _chat_messages(body.get("messages")), None
    readers = {
        "responses": responses_messages,
        "messages": anthropic_messages,
        "chat_batch": batch_messages,
    }
    reader = readers.get(endpoint)
    return None, None if reader is None else reader(body), None


def _completion_prompt(prompt: object) -> Inputs:
    if isinstance(prompt, str):
        return prompt, None, None
    if isinstance(prompt, list) and prompt:
        if all(_is_token(p) for p in prompt):
            return prompt, None, list(prompt)
        if all(isinstance(p, str) for p in prompt) or all(_is_token_list(p) for p in prompt):
            return prompt, None, None
    return None, None, None  # nothing to route on: the engine judges the prompt


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and all(_is_token(t) for t in value)


def _chat_messages(value: object) -> list[dict[str, Any]] | None:
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value):
        return value
    return None


def _priority(headers: Mapping[str, str]) -> str | None:
    """The client's ``x-kvstack-priority``, refused (400) unless it is a known one, under every
    admission: the default one ignores priorities, but a typo must not pass silently."""
    priority = headers.get(PRIORITY_HEADER)
    if priority is not None and priority not in PRIORITIES:
        raise RequestError(
            f"{PRIORITY_HEADER} {priority!r} is not one of {', '.join(PRIORITIES)}",
            param=PRIORITY_HEADER,
            code="invalid_priority",
        )
    return priority
