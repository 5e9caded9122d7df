"""Request validation as vLLM 0.32 does it, so the simulator accepts what vLLM accepts.

Two layers, as in vLLM. First the body is read by a pydantic model of the fields the
simulator uses, typed as vLLM's request models type them and read in pydantic's lax mode as
theirs are (``"max_tokens": "8"`` is 8, ``"stream": 1`` is true, a fractional float is
refused); a refusal is vLLM's validation error: type ``Bad Request``, param ``body.<field>``.
Then the values are checked as vLLM's sampling parameters check them, with its messages:
type ``BadRequestError``, param the field (or none where vLLM names none). The cases are
recorded from a real engine in ``tests/sim/data/vllm_validation.json``.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvstack.sim.api_error import APIError, bad_request

__all__ = [
    "ChatBody",
    "ChatTokenizeBody",
    "CompletionBody",
    "DetokenizeBody",
    "TokenizeBody",
    "check_sampling",
    "read_body",
]

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
TokenId = Annotated[int, Field(ge=0)]
B = TypeVar("B", bound=BaseModel)


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_tokens: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    priority: int = 0
    cache_salt: Any = None  # vLLM checks it itself, with its own message


class CompletionBody(_Sampling):
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    logprobs: int | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Sampling):
    messages: list[_Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class TokenizeBody(BaseModel):
    """``/tokenize`` with a prompt (vLLM's ``TokenizeCompletionRequest``)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str


class ChatTokenizeBody(BaseModel):
    """``/tokenize`` with messages (vLLM's ``TokenizeChatRequest``)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[_Message]
    add_generation_prompt: bool = True


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[TokenId]


def read_body(cls: type[B], body: Any) -> B:
    """``body`` read by ``cls``; vLLM's ``Bad Request`` naming the first bad field."""
    try:
        return cls.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        param = "body" + "".join(f".{part}" for part in _location(errors[0]["loc"]))
        count = len(errors)
        lines = "\n".join(
            f"  {{'type': {e['type']!r}, 'loc': {param!r}, 'msg': {e['msg']!r}}}" for e in errors
        )
        message = f"{count} validation error{'s' if count > 1 else ''}:\n{lines}"
        raise APIError(400, message, "Bad Request", param) from None


def _location(loc: tuple[int | str, ...]) -> list[str]:
    """The field path, without pydantic's names for union members (``list[int]``, ``str``)."""
    return [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _MARKERS))]


_MARKERS = frozenset({"str", "int", "float", "bool", "list", "dict", "function-after", "union"})


def _range_error(name: str, message: str, with_param: bool = True) -> APIError:
    return bad_request(message, name if with_param else None)


def check_sampling(body: _Sampling, max_tokens: int | None, vocab_size: int) -> None:
    """vLLM's checks of the sampling parameters, in its order and words."""
    if body.stream_options is not None and not body.stream:
        raise bad_request(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        )
    if body.n < 1:
        raise _range_error("n", f"n must be at least 1, got {body.n}.", with_param=False)
    _check_temperature(body.temperature)
    if body.top_p is not None and not 0 < body.top_p <= 1:
        raise _range_error("top_p", f"top_p must be in (0, 1], got {float(body.top_p)}. "
                           f"(parameter=top_p, value={float(body.top_p)})")  # fmt: skip
    if body.top_k is not None and body.top_k < -1:
        raise _range_error(
            "top_k", f"top_k must be 0 (disable), or at least 1, got {body.top_k}.", False
        )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value is not None and not -2 <= value <= 2:
            raise _range_error(name, f"{name} must be in [-2, 2], got {float(value)}.", False)
    if max_tokens is not None and body.min_tokens > max_tokens:
        raise _range_error(
            "min_tokens",
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got "
            f"{body.min_tokens}.",
            with_param=False,
        )
    _check_cache_salt(body.cache_salt)
    _check_logprobs(body, vocab_size)


_SALT_FORBIDDEN = frozenset("@/\\\x00")
MAX_CACHE_SALT_CHARS = 128


def _check_cache_salt(salt: object) -> None:
    """vLLM's ``validate_cache_salt``: a non-empty string of at most 128 characters without
    '@', '/', '\\' or NUL (vLLM keeps these out of the keys of downstream cache backends)."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise bad_request(
            "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)",
            "cache_salt",
        )
    if len(salt) > MAX_CACHE_SALT_CHARS or any(c in _SALT_FORBIDDEN for c in salt):
        raise bad_request(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', "
            "'/', '\\\\', or NUL. (parameter=cache_salt)",
            "cache_salt",
        )


def _check_temperature(value: float | None) -> None:
    if value is None:
        return
    shown = f"{float(value)}. (parameter=temperature, value={float(value)})"
    if value < 0:
        raise _range_error("temperature", f"temperature must be non-negative, got {shown}")
    if value > 2:
        raise _range_error("temperature", f"temperature must be in [0, 2], got {shown}")


def _check_logprobs(body: _Sampling, vocab_size: int) -> None:
    if isinstance(body, ChatBody):
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request(
                "when using `top_logprobs`, `logprobs` must be set to true. "
                "(parameter=top_logprobs)",
                "top_logprobs",
            )
        wanted = body.top_logprobs if body.logprobs else None
    else:
        wanted = getattr(body, "logprobs", None)
    if wanted is None:
        return
    wanted = vocab_size if wanted == -1 else wanted  # -1: the whole vocabulary
    if wanted < 0 or wanted > MAX_LOGPROBS:
        raise bad_request(
            f"Requested sample logprobs of {wanted}, which is greater than max allowed: "
            f"{MAX_LOGPROBS} (parameter=logprobs, value={wanted})",
            "logprobs",
        )
