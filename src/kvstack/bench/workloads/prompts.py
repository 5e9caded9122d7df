"""Prompts of an exact token count, for the simulator's tokenizer or a real model's.

A prompt is a run of words each of which is exactly one token, so ``text(n)`` has ``n``
tokens. For the simulator the words are ``t<id>``; for a Hugging Face tokenizer they are
vocabulary entries that decode to a space plus letters and re-encode to the same single id
(byte-level BPE and SentencePiece split at spaces, so such words never merge). The builder
verifies this on a sample at construction and refuses a tokenizer where it does not hold.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from kvstack.errors import require
from kvstack.sim.tokenizer import NUM_SPECIAL

__all__ = ["HFPromptBuilder", "PromptBuilder", "SimPromptBuilder", "make_prompt_builder"]


class PromptBuilder(ABC):
    """Builds texts of known token counts and counts the tokens of chat prompts."""

    def __init__(self, words: Sequence[str]) -> None:
        if len(words) < 64:
            raise ValueError(f"need at least 64 single-token words, found {len(words)}")
        self.words = list(words)

    def text(self, num_tokens: int, rng: random.Random) -> str:
        """``num_tokens`` random single-token words, each with its leading space."""
        return "".join(rng.choices(self.words, k=num_tokens))

    @abstractmethod
    def count(self, text: str) -> int:
        """Tokens of ``text`` as a completion prompt."""

    @abstractmethod
    def count_chat(self, messages: list[dict[str, Any]]) -> int:
        """Tokens of a chat prompt (template included, generation prompt added)."""


class SimPromptBuilder(PromptBuilder):
    """For ``kvstack sim-engine``: words ``t<id>`` over the whole vocabulary."""

    def __init__(self, vocab_size: int = 32000) -> None:
        from kvstack.sim.tokenizer import SimTokenizer

        self.tokenizer = SimTokenizer(vocab_size)
        super().__init__([f" t{i}" for i in range(NUM_SPECIAL, vocab_size)])

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def count_chat(self, messages: list[dict[str, Any]]) -> int:
        return len(self.tokenizer.apply_chat_template(messages))


class HFPromptBuilder(PromptBuilder):
    """For a real model: its tokenizer, loaded with transformers from the model directory."""

    def __init__(self, model_path: str, sample_tokens: int = 400) -> None:
        transformers: Any = require("transformers", "dev")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
        super().__init__(self._single_token_words())
        self._verify(sample_tokens)

    def _single_token_words(self) -> list[str]:
        tok = self.tokenizer
        special = set(tok.all_special_ids)
        words = []
        for token_id in range(len(tok)):
            if token_id in special:
                continue
            text = tok.decode([token_id])
            plain = len(text) > 2 and text[0] == " " and text[1:].isalpha() and text.isascii()
            if plain and tok.encode(text, add_special_tokens=False) == [token_id]:
                words.append(text)
        return words

    def _verify(self, num_tokens: int) -> None:
        text = self.text(num_tokens, random.Random(0))
        got = self.count(text)
        if got != num_tokens:
            raise ValueError(
                f"tokenizer does not keep single-token words apart: {num_tokens} words "
                f"encode to {got} tokens"
            )

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def count_chat(self, messages: list[dict[str, Any]]) -> int:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)


def make_prompt_builder(tokenizer: str) -> PromptBuilder:
    """``sim`` or ``sim:VOCAB`` for the simulator, else a model path or name for transformers."""
    if tokenizer == "sim" or tokenizer.startswith("sim:"):
        _, _, vocab = tokenizer.partition(":")
        return SimPromptBuilder(int(vocab) if vocab else 32000)
    return HFPromptBuilder(tokenizer)
