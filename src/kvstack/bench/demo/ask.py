"""One greedy completion of a token-id prompt, streamed and timed: the story's unit of work.

The answer keeps what "identical" is checked on: the generated token ids and their logprobs
(vLLM: ``return_token_ids`` and ``logprobs: 0``) and the text. Simulated engines return text
only; their answers are synthetic, so the demo says that identity is not checked there.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvstack.bench.workloads.prompts import PromptBuilder

__all__ = ["GreedyAnswer", "ask", "warm_up"]


@dataclass(frozen=True, slots=True)
class GreedyAnswer:
    ttft_s: float  # from sending the request to the first generated token
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    prompt_tokens: int | None = field(default=None, compare=False)

    def same_output(self, other: GreedyAnswer) -> bool:
        """Same tokens, same logprobs (bit for bit, as JSON carries them), same text."""
        mine = (self.token_ids, self.logprobs, self.text)
        return mine == (other.token_ids, other.logprobs, other.text)


def ask(url: str, model: str, prompt: Sequence[int] | str, max_tokens: int) -> GreedyAnswer:
    """Greedy, exactly ``max_tokens`` tokens (``ignore_eos``), streamed from ``url``."""
    body = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft_s: float | None = None
    tokens: list[int] = []
    logprobs: list[float] = []
    text: list[str] = []
    prompt_tokens = None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as resp:
        if resp.status_code != 200:
            resp.read()
            raise httpx.HTTPStatusError(
                f"{url} answered {resp.status_code}: {resp.text[:300]}",
                request=resp.request,
                response=resp,
            )
        for chunk in _events(resp):
            usage = chunk.get("usage") or {}
            prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
            for choice in chunk.get("choices") or []:
                new = _read_choice(choice, tokens, logprobs, text)
                if new and ttft_s is None:
                    ttft_s = time.perf_counter() - start
    if ttft_s is None:
        raise httpx.RemoteProtocolError(f"{url}: the stream ended without a token")
    return GreedyAnswer(ttft_s, tuple(tokens), tuple(logprobs), "".join(text), prompt_tokens)


def warm_up(urls: Sequence[str], model: str, builder: PromptBuilder, seed: int) -> None:
    """One short unrelated request per engine: a fresh vLLM engine's first request pays one-time
    setup (seconds on a small CPU), which no measured step should carry. The prompt is shorter
    than a kvstack chunk and a vLLM block, so it leaves nothing in any cache."""
    rng = random.Random(seed)
    for url in urls:
        ask(url, model, builder.text(16, rng), 1)


def _events(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in resp.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def _read_choice(
    choice: dict[str, Any], tokens: list[int], logprobs: list[float], text: list[str]
) -> bool:
    """Append what one streamed choice carries; True when it carries generated output."""
    new_tokens = choice.get("token_ids") or []
    tokens.extend(new_tokens)
    logprobs.extend(lp for lp in (choice.get("logprobs") or {}).get("token_logprobs") or [])
    piece = choice.get("text") or ""
    text.append(piece)
    return bool(new_tokens or piece)
