"""What the router knows about a request: parsed once, validated, handed to every plugin.

``parse_request`` reads only the fields routing needs and checks them the way OpenAI's API does
(a :class:`~kvstack.errors.RequestError` renders as an OpenAI-style 400); every other field is
left for the backend and forwarded unchanged.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from kvstack.errors import RequestError

__all__ = ["Endpoint", "RoutingRequest", "encode_body", "parse_request", "prompt_text"]

Endpoint = Literal["completions", "chat"]
PRIORITY_HEADER = "x-kvstack-priority"
REQUEST_ID_HEADER = "x-request-id"

# Request ids: a per-process random prefix and a counter (uuid4 per request costs more).
_ID_PREFIX = os.urandom(6).hex()
_ids = itertools.count(1)
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingRequest:
    """A value object; ``target`` is filled in by model routing (``with_target``)."""

    request_id: str
    endpoint: Endpoint
    model: str  # the name the client asked for
    target: str = ""  # the base model or adapter the backends must serve
    prompt: str | list[Any] | None = None  # completions
    messages: list[dict[str, Any]] | None = None  # chat
    token_ids: list[int] | None = None  # when the client sent token ids
    stream: bool = False
    max_tokens: int | None = None
    priority: str | None = None
    session_id: str | None = None  # header, else the OpenAI `user` field
    user: str | None = None
    tenant: str | None = None  # from the API key
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, Any] = field(default_factory=dict)
    arrival_s: float = 0.0  # time.perf_counter() at arrival
    # Per-request memo shared by plugins (the rendered prompt, prefix matches, predictions),
    # so work is done once per request however many plugins need it.
    scratch: dict[str, Any] = field(default_factory=dict, compare=False)

    def with_target(self, target: str) -> RoutingRequest:
        return dataclasses.replace(self, target=target, scratch={})

    @property
    def text(self) -> str:
        """The prompt as text (chat messages concatenated; empty for token-id prompts)."""
        return prompt_text(self.prompt, self.messages)

    @property
    def estimated_prompt_tokens(self) -> int:
        """The rendered prompt's length once tokenized (``scratch["prompt"]``), token ids when
        sent, else ~4 characters per token."""
        rendered = self.scratch.get("prompt")
        if rendered is not None:
            return len(rendered.tokens)
        if self.token_ids is not None:
            return len(self.token_ids)
        return len(self.text) // 4 + 1


def prompt_text(prompt: object, messages: Sequence[Mapping[str, Any]] | None) -> str:
    if messages is not None:
        return "".join(_content_text(m.get("content")) for m in messages)
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    return ""


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, {"type": "image_url"...}]
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def parse_request(
    endpoint: Endpoint,
    raw: bytes,
    headers: Mapping[str, str],
    *,
    session_header: str = "x-session-id",
    tenant: str | None = None,
    arrival_s: float | None = None,
) -> RoutingRequest:
    """Parse and check a completions or chat body; raise :class:`RequestError` (400)."""
    body = _decode_object(raw)
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
        priority=headers.get(PRIORITY_HEADER),
        session_id=headers.get(session_header) or user,
        user=user,
        tenant=tenant,
        headers=headers,
        body=body,
        arrival_s=time.perf_counter() if arrival_s is None else arrival_s,
    )


def encode_body(body: Mapping[str, Any]) -> bytes:
    return _encoder.encode(body)


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
