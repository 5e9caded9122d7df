"""Response bodies and SSE chunks in vLLM 0.32's shapes (``tests/sim/data/vllm_http.json``).

One response answers one or more sequences (a batch of prompts, ``n`` choices each), in
vLLM's order: choice ``i * n + j`` is prompt ``i``'s ``j``-th answer; usage counts each prompt
once and every generated token. One addition: ``usage.prompt_tokens_details.cached_tokens`` is
always filled (vLLM fills it with ``--enable-prompt-tokens-details``), so benchmarks can read
per-request cache hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from kvstack.sim.request import SimRequest

__all__ = ["DONE", "Choice", "Renderer"]

DONE = b"data: [DONE]\n\n"
SYSTEM_FINGERPRINT = "kvstack-sim"
_encode = msgspec.json.encode


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    req: SimRequest
    counts_prompt: bool  # the first answer to its prompt (usage counts the prompt once)


class Renderer:
    """Builds the JSON of one response (completion or chat, whole or streamed)."""

    def __init__(
        self, choices: Sequence[Choice], model: str, chat: bool, created: int, request_id: str
    ) -> None:
        self.choices = list(choices)
        self.model = model
        self.chat = chat
        self.created = created
        self.response_id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def usage(self) -> dict[str, Any]:
        prompt = sum(c.req.num_prompt for c in self.choices if c.counts_prompt)
        cached = sum(
            c.req.local_hit_tokens + c.req.external_hit_tokens
            for c in self.choices
            if c.counts_prompt
        )
        output = sum(c.req.num_output for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + output,
            "completion_tokens": output,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    @staticmethod
    def _finish_reason(req: SimRequest) -> str | None:
        return None if req.finish_reason is None else req.finish_reason.value

    def full(self, texts: Sequence[str]) -> bytes:
        """The whole answer; ``texts[k]`` is choice ``k``'s output."""
        choices = []
        for choice, text in zip(self.choices, texts, strict=True):
            entry: dict[str, Any] = {"index": choice.index}
            if self.chat:
                entry["message"] = {"role": "assistant", "content": text, "refusal": None}
            else:
                entry["text"] = text
            finish = self._finish_reason(choice.req)
            entry |= {"logprobs": None, "finish_reason": finish, "stop_reason": None}
            choices.append(entry)
        body = {
            "id": self.response_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": self.usage(),
            "kv_transfer_params": None,
        }
        return _encode(body)

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {"id": self.response_id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices, **extra}  # fmt: skip
        return b"data: " + _encode(body) + b"\n\n"

    def chunk(self, choice: Choice, text: str, last: bool) -> bytes:
        finish = self._finish_reason(choice.req) if last else None
        entry: dict[str, Any] = {"index": choice.index}
        if self.chat:
            entry["delta"] = {"content": text}
        else:
            entry["text"] = text
        entry |= {"logprobs": None, "finish_reason": finish}
        if finish is None:
            return self._event([entry])
        entry["stop_reason"] = None
        return self._event([entry], system_fingerprint=SYSTEM_FINGERPRINT)

    def role_chunk(self, choice: Choice) -> bytes:
        """A chat stream's first chunk of a choice: the assistant role, empty content."""
        entry = {
            "index": choice.index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._event([entry])

    def usage_chunk(self) -> bytes:
        return self._event([], usage=self.usage())
