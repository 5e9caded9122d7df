"""Parsing OpenAI request bodies the way vLLM does, and vLLM's error shape.

Only what the simulator needs is read: the model, the prompt (text, token ids, or chat
messages), ``max_tokens`` / ``max_completion_tokens``, ``stream`` and
``stream_options.include_usage``, ``priority``, ``cache_salt`` and ``n`` (1 only). Sampling
fields are accepted and ignored: output is synthetic. Errors carry vLLM's JSON shape
``{"error": {"message", "type", "param", "code"}}`` and status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstack.sim.tokenizer import ChatError, SimTokenizer

__all__ = ["APIError", "GenerateParams", "parse_chat", "parse_completion"]

COMPLETION_DEFAULT_MAX_TOKENS = 16  # the OpenAI completions default, as in vLLM


class APIError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "BadRequestError", param)


@dataclass(frozen=True, slots=True)
class GenerateParams:
    model: str | None
    prompt_tokens: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    priority: int
    cache_salt: str | None
    chat: bool


def parse_completion(body: Any, tokenizer: SimTokenizer) -> GenerateParams:
    obj = _object(body)
    prompt = obj.get("prompt")
    if prompt is None or prompt == "" or prompt == []:
        raise bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
            "prompt",
        )
    return _params(obj, _prompt_tokens(prompt, tokenizer), _int_field(obj, "max_tokens"), False)


def parse_chat(body: Any, tokenizer: SimTokenizer) -> GenerateParams:
    obj = _object(body)
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages", "messages")
    if not all(isinstance(m, dict) for m in messages):
        raise bad_request("every message must be an object", "messages")
    add_generation_prompt = obj.get("add_generation_prompt", True) is not False
    try:
        tokens = tokenizer.apply_chat_template(messages, add_generation_prompt)
    except ChatError as exc:
        raise bad_request(str(exc), "messages") from None
    max_tokens = _int_field(obj, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int_field(obj, "max_tokens")
    return _params(obj, tokens, max_tokens, True)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _params(
    obj: dict[str, Any], tokens: list[int], max_tokens: int | None, chat: bool
) -> GenerateParams:
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    n = _int_field(obj, "n")
    if n not in (None, 1):
        raise bad_request(f"n={n} is not supported by the simulator; use n=1", "n")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    options = obj.get("stream_options") or {}
    salt = _cache_salt(obj.get("cache_salt"))
    return GenerateParams(
        model=model,
        prompt_tokens=tokens,
        max_tokens=max_tokens if max_tokens is not None or chat else COMPLETION_DEFAULT_MAX_TOKENS,
        stream=bool(obj.get("stream", False)),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage", False)),
        priority=_int_field(obj, "priority") or 0,
        cache_salt=salt,
        chat=chat,
    )


_SALT_FORBIDDEN = frozenset("@/\\\x00")
MAX_CACHE_SALT_CHARS = 128


def _cache_salt(salt: object) -> str | None:
    """vLLM's ``validate_cache_salt``: a non-empty string of at most 128 characters without
    '@', '/', '\\' or NUL (vLLM keeps these out of the keys of downstream cache backends)."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise bad_request(
            "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt"
        )
    if len(salt) > MAX_CACHE_SALT_CHARS or any(c in _SALT_FORBIDDEN for c in salt):
        raise bad_request(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', "
            "'/', '\\\\', or NUL.",
            "cache_salt",
        )
    return salt


def _int_field(obj: dict[str, Any], name: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"'{name}' must be an integer, got {value!r}", name)
    return value


def _prompt_tokens(prompt: Any, tokenizer: SimTokenizer) -> list[int]:
    """A string, a list of token ids, or a one-element batch of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _checked(tokenizer.encode, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(
            "the simulator serves one prompt per request; send a batch as separate requests",
            "prompt",
        )
    if isinstance(prompt, list):
        return _checked(tokenizer.check_ids, prompt)
    raise bad_request("'prompt' must be a string or a list of token ids", "prompt")


def _checked(fn: Callable[[Any], list[int]], value: Any) -> list[int]:
    try:
        tokens = fn(value)
    except ValueError as exc:
        raise bad_request(str(exc), "prompt") from None
    if not tokens:
        raise bad_request("the prompt has no tokens", "prompt")
    return tokens
