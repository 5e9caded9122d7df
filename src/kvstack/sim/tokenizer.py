"""The simulator's deterministic tokenizer: one whitespace-separated word is one token.

- A word ``t<N>`` with ``NUM_SPECIAL <= N < vocab_size`` is token ``N`` (so ``decode`` and
  ``encode`` round-trip: ``decode([523, 77]) == " t523 t77"``).
- The special words below are their ids; any other word maps to a stable id in
  ``[NUM_SPECIAL, vocab_size)`` via BLAKE2b, identical in every process.
- Chat: each message is ``<|role|>`` + content tokens + ``<|end|>`` (any role: an unknown one
  is the word ``<|role|>``); the generation prompt appends ``<|assistant|>``. No BOS token is
  added (like the toy model's tokenizer).

So a prompt of exactly N tokens is N words, and ``"t17 t18 t19"`` names token ids directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["NUM_SPECIAL", "SPECIAL_TOKENS", "ChatError", "SimTokenizer"]

NUM_SPECIAL = 16
SPECIAL_TOKENS: dict[str, int] = {
    "<unk>": 0,
    "<s>": 1,
    "</s>": 2,
    "<|system|>": 3,
    "<|user|>": 4,
    "<|assistant|>": 5,
    "<|end|>": 6,
    "<|tool|>": 7,
}
_ROLE_TOKENS = {"system": 3, "developer": 3, "user": 4, "assistant": 5, "tool": 7}
_END = SPECIAL_TOKENS["<|end|>"]
_ASSISTANT = SPECIAL_TOKENS["<|assistant|>"]
_MEMO_LIMIT = 1 << 20
_TEXT_MEMO_LIMIT = 4096


class ChatError(ValueError):
    """A chat message the template cannot render (unknown role, bad content)."""


class SimTokenizer:
    def __init__(self, vocab_size: int) -> None:
        if vocab_size <= NUM_SPECIAL:
            raise ValueError(f"vocab_size must be > {NUM_SPECIAL}, got {vocab_size}")
        self.vocab_size = vocab_size
        self._span = vocab_size - NUM_SPECIAL
        self._names = {v: k for k, v in SPECIAL_TOKENS.items()}
        self._memo: dict[str, int] = dict(SPECIAL_TOKENS)
        # Whole texts, for benchmarks that resend the same prompts (shared prefixes).
        self._texts: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str) -> list[int]:
        cached = self._texts.get(text)
        if cached is not None:
            return list(cached)
        ids = self._encode(text)
        if len(self._texts) >= _TEXT_MEMO_LIMIT:
            self._texts.clear()
        self._texts[text] = tuple(ids)
        return ids

    def _encode(self, text: str) -> list[int]:
        words = text.split()
        get = self._memo.get
        ids = [get(word) for word in words]
        if None in ids:
            ids = [self._word_id(w) if i is None else i for i, w in zip(ids, words, strict=True)]
        return ids  # type: ignore[return-value]

    def _word_id(self, word: str) -> int:
        if word[0] == "t" and word[1:].isdigit():
            value = int(word[1:])
            if NUM_SPECIAL <= value < self.vocab_size:
                return self._remember(word, value)
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        return self._remember(word, NUM_SPECIAL + int.from_bytes(digest, "little") % self._span)

    def _remember(self, word: str, token: int) -> int:
        if len(self._memo) >= _MEMO_LIMIT:  # bounded: workloads reuse a small vocabulary
            self._memo = dict(SPECIAL_TOKENS)
        self._memo[word] = token
        return token

    def piece(self, token: int) -> str:
        """The word of one token id."""
        return self._names.get(token) or f"t{token}"

    def decode(self, tokens: Iterable[int]) -> str:
        """Text of ``tokens``: each word with a leading space, so pieces concatenate."""
        return "".join(" " + self.piece(t) for t in tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        tokens: list[int] = []
        for index, message in enumerate(messages):
            role = message.get("role")
            if not isinstance(role, str):
                raise ChatError(f"messages[{index}].role must be a string, got {role!r}")
            # Any role renders, as with vLLM's templates: an unknown one is its own word.
            tokens.append(_ROLE_TOKENS.get(role) or self._word_id(f"<|{role}|>"))
            tokens += self.encode(_content_text(message.get("content"), index))
            tokens.append(_END)
        if add_generation_prompt:
            tokens.append(_ASSISTANT)
        return tokens

    def check_ids(self, tokens: Sequence[Any]) -> list[int]:
        """Validate a token-id prompt; raises ValueError naming the first bad id."""
        for token in tokens:
            if not isinstance(token, int) or isinstance(token, bool):
                raise ValueError(f"token id {token!r} is not an integer")
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"Token id {token} is out of vocabulary")
        return list(tokens)


def _content_text(content: Any, index: int) -> str:
    """Message content: a string, None, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ChatError(f"messages[{index}].content: only text parts are supported")
            parts.append(str(part.get("text", "")))
        return " ".join(parts)
    raise ChatError(f"messages[{index}].content must be a string or a list of text parts")
