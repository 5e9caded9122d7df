"""Prompt tokenizers for routing: the prompt as the engine will see it, as token ids.

- ``HFTokenizer``: a local model directory loaded with transformers (``AutoTokenizer``); chat
  prompts go through the model's chat template with the generation prompt, as vLLM renders
  them (template text, then tokens without added special tokens); completions are tokenized
  with the special tokens vLLM adds (e.g. BOS). Exact: the ids match the engine's.
- ``SimPromptTokenizer``: the simulator's tokenizer (``kvstack sim-engine``). Exact.
- ``CharBlocks``: no tokenizer at hand; every 4 characters of the rendered prompt stand for one
  token. Approximate only (it never matches an engine's KV events), but prefix-preserving and
  rendered over the *whole* conversation, so routing still follows shared prefixes.

:class:`PromptTokens` is what rendering a prompt gives (:mod:`kvstack.router.scheduling.prompts`).

Specs (``router.prefix.tokenizers``): ``chars``, ``sim``, ``sim:VOCAB``, or a path. Loading a
model tokenizer reads files: call :func:`make_tokenizer` off the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from kvstack.errors import ConfigError, require
from kvstack.index.radix import RadixNamespace

__all__ = [
    "CharBlocks",
    "HFTokenizer",
    "PromptTokenizer",
    "PromptTokens",
    "SimPromptTokenizer",
    "make_tokenizer",
]

CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A rendered prompt: its token ids in the namespace its KV lives in."""

    tokens: list[int]
    namespace: RadixNamespace
    exact: bool  # the engine's own ids: KV events and shared tiers can match them


class PromptTokenizer(Protocol):
    #: True when the ids are the engine's own (KV events and shared tiers can be matched).
    exact: bool
    #: Prompts longer than this (characters) are tokenized on a worker thread.
    inline_chars: int

    def completion(self, prompt: str) -> list[int]: ...

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]: ...


class CharBlocks:
    exact = False
    inline_chars = 1 << 30  # a slice and a hash per 4 characters: always cheap enough

    def completion(self, prompt: str) -> list[int]:
        # str hashes are per process: fine, the tree lives in this process only.
        n = CHARS_PER_TOKEN
        return [hash(prompt[i : i + n]) & 0x7FFFFFFF for i in range(0, len(prompt), n)]

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return self.completion(render_messages(messages))


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Every message, role and content (and tool calls), in order: a stable text stand-in for
    a chat template, so conversations sharing a history share a prefix."""
    parts = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            content = msgspec.json.encode(content).decode()
        extra = {k: v for k, v in m.items() if k not in ("role", "content")}
        tail = msgspec.json.encode(extra).decode() if extra else ""
        parts.append(f"<|{m.get('role')}|>{content}{tail}<|end|>")
    return "".join(parts) + "<|assistant|>"


class SimPromptTokenizer:
    exact = True
    inline_chars = 1 << 30

    def __init__(self, vocab_size: int = 32000) -> None:
        from kvstack.sim.tokenizer import SimTokenizer

        self._tok = SimTokenizer(vocab_size)

    def completion(self, prompt: str) -> list[int]:
        return self._tok.encode(prompt)

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return self._tok.apply_chat_template(messages)


class HFTokenizer:
    exact = True
    inline_chars = 2048  # longer prompts cost milliseconds: a worker thread takes them

    def __init__(self, path: str) -> None:
        transformers: Any = require("transformers", "hf")
        try:
            self._tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the tokenizer at {path!r}: {exc}") from None

    def completion(self, prompt: str) -> list[int]:
        return list(self._tok.encode(prompt, add_special_tokens=True))

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        text = self._tok.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )
        return list(self._tok.encode(text, add_special_tokens=False))


def make_tokenizer(spec: str) -> PromptTokenizer:
    """The tokenizer a spec names (blocking for model directories)."""
    if spec == "chars":
        return CharBlocks()
    if spec == "sim" or spec.startswith("sim:"):
        vocab = spec.partition(":")[2]
        if vocab and not vocab.isdigit():
            raise ConfigError(f"tokenizer {spec!r}: use sim or sim:VOCAB_SIZE")
        return SimPromptTokenizer(int(vocab) if vocab else 32000)
    return HFTokenizer(spec)
