"""Parsing OpenAI request bodies the way vLLM does, and vLLM's error shape.

What the simulator reads: the model, the prompts (text, token ids, a batch of either, or chat
messages), ``n``, ``max_tokens`` / ``max_completion_tokens``, ``stream`` and
``stream_options.include_usage``, ``priority`` and ``cache_salt``. Other sampling fields are
validated as vLLM validates them (:mod:`kvstack.sim.validation`) and otherwise ignored: output
is synthetic. Errors carry vLLM's ``ErrorResponse`` shape
``{"error": {"message", "type", "param", "code"}}`` and status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstack.sim.api_error import APIError, bad_request
from kvstack.sim.tokenizer import ChatError, SimTokenizer
from kvstack.sim.validation import ChatBody, CompletionBody, check_sampling, read_body

__all__ = ["APIError", "GenerateParams", "bad_request", "parse_chat", "parse_completion"]

COMPLETION_DEFAULT_MAX_TOKENS = 16  # the OpenAI completions default, as in vLLM


@dataclass(frozen=True, slots=True)
class GenerateParams:
    model: str | None
    prompts: tuple[list[int], ...]  # one or more (a batch); each answered ``n`` times
    n: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    priority: int
    cache_salt: str | None
    chat: bool

    @property
    def prompt_tokens(self) -> list[int]:
        return self.prompts[0]


def parse_completion(body: Any, tokenizer: SimTokenizer) -> GenerateParams:
    obj = read_body(CompletionBody, body)
    prompts = _prompts(obj.prompt, tokenizer)
    _check_max_tokens(obj.max_tokens)
    check_sampling(obj, obj.max_tokens, tokenizer.vocab_size)
    return _params(obj, prompts, obj.max_tokens, chat=False)


def parse_chat(body: Any, tokenizer: SimTokenizer) -> GenerateParams:
    obj = read_body(ChatBody, body)
    if not obj.messages:
        raise bad_request(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    if obj.continue_final_message and obj.add_generation_prompt:
        raise bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    messages = [m.model_dump() for m in obj.messages]
    try:
        tokens = tokenizer.apply_chat_template(messages, obj.add_generation_prompt)
    except ChatError as exc:
        raise bad_request(str(exc), "messages") from None
    max_tokens = obj.max_completion_tokens
    max_tokens = obj.max_tokens if max_tokens is None else max_tokens
    _check_max_tokens(max_tokens)
    check_sampling(obj, max_tokens, tokenizer.vocab_size)
    return _params(obj, (tokens,), max_tokens, chat=True)


def _check_max_tokens(max_tokens: int | None) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {max_tokens}. "
            f"(parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )


def _params(
    obj: Any, prompts: tuple[list[int], ...], max_tokens: int | None, chat: bool
) -> GenerateParams:
    options = obj.stream_options or {}
    return GenerateParams(
        model=obj.model,
        prompts=prompts,
        n=obj.n,
        max_tokens=max_tokens if max_tokens is not None or chat else COMPLETION_DEFAULT_MAX_TOKENS,
        stream=bool(obj.stream),
        include_usage=bool(options.get("include_usage", False)),
        priority=obj.priority,
        cache_salt=obj.cache_salt,
        chat=chat,
    )


def _prompts(prompt: Any, tokenizer: SimTokenizer) -> tuple[list[int], ...]:
    """A string, token ids, or a batch of either (validated types: see CompletionBody)."""
    if prompt is None or prompt == "" or prompt == []:
        raise bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
            "prompt",
        )
    if isinstance(prompt, str):
        return (_checked(tokenizer.encode, prompt),)
    if all(isinstance(p, int) for p in prompt):
        return (_checked(tokenizer.check_ids, prompt),)
    encode: Callable[[Any], list[int]] = tokenizer.encode
    return tuple(_checked(encode if isinstance(p, str) else tokenizer.check_ids, p) for p in prompt)


def _checked(fn: Callable[[Any], list[int]], value: Any) -> list[int]:
    try:
        tokens = fn(value)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if not tokens:
        raise bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
            "prompt",
        )
    return tokens
