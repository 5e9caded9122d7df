"""What the router knows about a request, and what its stages learn about it on the way.

:class:`RoutingRequest` is the value every stage reads: the fields routing needs, parsed once
(:func:`kvstack.router.http.parse.parse_request`), with ``target`` set by model routing.
:class:`RequestState` is its typed memo. Each field is written by one stage and read by later
ones, so work is done once per request however many plugins need it::

    field              written by                          read by
    prompt             scheduling.prompts (render)         prefix, load accounting
    tier_hits          prefix.state (prepare: the index)   prefix.state (view)
    prefix_match       prefix.state (view)                 prefix.state (view)
    uncached_tokens    plugins.cost (score)                load lease, pd
    predictions        plugins.cost (score)                plugins.cost (first token)
    dispatched_s       plugins.cost (dispatch)             plugins.cost (first token)
    radix_locks        prefix.state (dispatch)             prefix.state (finish)
    permit             proxy (admission)                   admission.priority, release()
    adapter            adapters (resolve)                  prompts, adapters, plugins.lora
    adapter_decisions  adapters (attempt, prefill hold)    adapters (finish), release()
    remote_prefill     pd (before the first attempt)       plugins.cost (first token)
    answer             proxy (first body byte)             adapters (finish)

Model routing replaces the request (``with_target``) before any stage runs: a new target
starts from an empty state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import msgspec

from kvstack.router.http.forms import replace_form_field

if TYPE_CHECKING:
    from kvstack.index.radix import Owner, PrefixMatch
    from kvstack.index.radix_node import Node
    from kvstack.lora.decision import AdapterDecision
    from kvstack.lora.resolver import AdapterResolution
    from kvstack.router.admission.permit import Permit
    from kvstack.router.pd.plan import PrefillOutcome
    from kvstack.router.scheduling.cost_model import Prediction
    from kvstack.router.scheduling.tokenizers import PromptTokens

__all__ = [
    "ADMIN_HEADER",
    "GENERATION_ENDPOINTS",
    "PATHS",
    "AnswerStart",
    "Endpoint",
    "RequestState",
    "RoutingRequest",
    "encode_body",
    "prompt_text",
]

# The generation endpoints have their prompt rendered for prefix-aware routing; "other" is any
# route forwarded by model alone (embeddings, tokenize, audio, ...: kvstack.router.http.routes).
Endpoint = Literal["completions", "chat", "responses", "messages", "chat_batch", "other"]
GENERATION_ENDPOINTS: frozenset[Endpoint] = frozenset(
    {"completions", "chat", "responses", "messages", "chat_batch"}
)
PATHS: Mapping[Endpoint, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "chat_batch": "/v1/chat/completions/batch",
}
PRIORITY_HEADER = "x-kvstack-priority"
ADMIN_HEADER = "x-kvstack-admin-key"  # never forwarded to a backend
REQUEST_ID_HEADER = "x-request-id"
_encoder = msgspec.json.Encoder()


class AnswerStart(NamedTuple):
    """The first body bytes of the attempt that answered, and when they came."""

    backend_id: str
    first_bytes: bytes  # the engine names the model it served in them
    ttft_s: float  # from the request's arrival


@dataclass(slots=True, eq=False)
class RequestState:
    """One request's typed memo (the table above says who writes and who reads each field)."""

    prompt: PromptTokens | None = None
    tier_hits: dict[str, dict[str, int]] = field(default_factory=dict)  # backend -> tier -> n
    prefix_match: PrefixMatch | None = None
    uncached_tokens: dict[str, float] = field(default_factory=dict)  # backend -> tokens
    predictions: dict[str, Prediction] = field(default_factory=dict)  # backend -> TTFT
    dispatched_s: float | None = None  # perf_counter at the last dispatch
    radix_locks: dict[str, list[tuple[Owner, Node]]] = field(default_factory=dict)
    permit: Permit | None = None
    adapter: AdapterResolution | None = None  # the registered adapter the name resolved to
    adapter_decisions: dict[str, AdapterDecision] = field(default_factory=dict)  # by backend
    remote_prefill: PrefillOutcome | None = None
    answer: AnswerStart | None = None

    def release(self) -> None:
        """The request ended however it ended: give the admission permit back and finish the
        adapter decisions no attempt finished (one cancelled before its dispatch)."""
        if self.permit is not None:
            permit, self.permit = self.permit, None
            permit.release()
        while self.adapter_decisions:
            _, decision = self.adapter_decisions.popitem()
            decision.finish(ok=False)


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
    privileged: bool = False  # may see routing internals (admin key, or router.debug_headers)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, Any] = field(default_factory=dict)
    arrival_s: float = 0.0  # time.perf_counter() at arrival
    method: str = "POST"
    route_path: str = ""  # the path (and query) sent upstream; "" for the endpoint's own
    pinned_backend: str | None = None  # only this backend may answer (it holds the state)
    state: RequestState = field(default_factory=RequestState, compare=False, repr=False)

    def with_target(self, target: str, **changes: Any) -> RoutingRequest:
        """The request aimed at ``target`` (with other ``changes``), from an empty state."""
        return dataclasses.replace(self, target=target, state=RequestState(), **changes)

    @property
    def path(self) -> str:
        """The backend path: the route's own (with its query), else the endpoint's."""
        return self.route_path or PATHS[self.endpoint]

    @property
    def is_form(self) -> bool:
        """The body is ``multipart/form-data`` (the audio routes), not JSON."""
        return self.headers.get("content-type", "").startswith("multipart/form-data")

    def body_with_model(self, raw: bytes, model: str) -> bytes:
        """``raw`` (this request's body as it stands) with its ``model`` replaced."""
        if self.is_form:
            return replace_form_field(raw, self.headers["content-type"], "model", model)
        return encode_body({**self.body, "model": model})

    @property
    def text(self) -> str:
        """The prompt as text (chat messages concatenated; empty for token-id prompts)."""
        return prompt_text(self.prompt, self.messages)

    @property
    def estimated_prompt_tokens(self) -> int:
        """The rendered prompt's length once tokenized, token ids when sent, else ~4 characters
        per token."""
        rendered = self.state.prompt
        if rendered is not None:
            return len(rendered.tokens)
        if self.token_ids is not None:
            return len(self.token_ids)
        return len(self.text) // 4 + 1

    def prefill_tokens(self, backend_id: str) -> int:
        """The prompt tokens ``backend_id`` must compute: the cost model's uncached estimate for
        it when one ran, else the whole prompt."""
        uncached = self.state.uncached_tokens.get(backend_id)
        return self.estimated_prompt_tokens if uncached is None else int(uncached)


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


def encode_body(body: Mapping[str, Any]) -> bytes:
    """A request body as JSON bytes (msgspec)."""
    return _encoder.encode(body)
