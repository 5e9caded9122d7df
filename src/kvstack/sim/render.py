"""Response bodies and SSE chunks in vLLM 0.32's shapes (``tests/sim/data/vllm_http.json``).

One addition: ``usage.prompt_tokens_details.cached_tokens`` is always filled (vLLM fills it
with ``--enable-prompt-tokens-details``), so benchmarks can read per-request cache hits.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvstack.sim.request import SimRequest

__all__ = ["DONE", "Renderer"]

DONE = b"data: [DONE]\n\n"
SYSTEM_FINGERPRINT = "kvstack-sim"
_encode = msgspec.json.encode


class Renderer:
    """Builds the JSON of one request's response (completion or chat, whole or streamed)."""

    def __init__(self, req: SimRequest, model: str, chat: bool, created: int) -> None:
        self.req = req
        self.model = model
        self.chat = chat
        self.created = created
        prefix = "chatcmpl-" if chat else "cmpl-"
        self.response_id = prefix + req.request_id
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def usage(self) -> dict[str, Any]:
        req = self.req
        return {
            "prompt_tokens": req.num_prompt,
            "total_tokens": req.num_tokens,
            "completion_tokens": req.num_output,
            "prompt_tokens_details": {
                "cached_tokens": req.local_hit_tokens + req.external_hit_tokens
            },
        }

    def _finish_reason(self) -> str | None:
        reason = self.req.finish_reason
        return None if reason is None else reason.value

    def full(self, text: str) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            choice["text"] = text
        choice |= {"logprobs": None, "finish_reason": self._finish_reason(), "stop_reason": None}
        body = {
            "id": self.response_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": self.usage(),
            "kv_transfer_params": None,
        }
        return _encode(body)

    def chunk(self, text: str, last: bool) -> bytes:
        finish = self._finish_reason() if last else None
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice |= {"logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if finish is not None:
            body["system_fingerprint"] = SYSTEM_FINGERPRINT
        return b"data: " + _encode(body) + b"\n\n"

    def role_chunk(self) -> bytes:
        """The first chunk of a chat stream: the assistant role, empty content."""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        body = {
            "id": self.response_id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        return b"data: " + _encode(body) + b"\n\n"

    def usage_chunk(self) -> bytes:
        body = {
            "id": self.response_id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(),
        }
        return b"data: " + _encode(body) + b"\n\n"
