"""Every route of vLLM's OpenAI-compatible server, and how the router serves each.

The table is read from vLLM's own OpenAPI schemas (``tests/router/data/vllm-*-openapi.json``,
fetched from real servers); ``tests/router/http/test_routes.py`` fails for any route in them
that is missing here, so a new vLLM route shows up as a failing test, not as a silent 404.

How a route is served (``Route.kind``):

- ``generate``: a generation route; forwarded by model, its prompt rendered for prefix-aware
  routing (completions, chat, Responses, Anthropic Messages, chat batches).
- ``model``: forwarded to a backend of the body's ``model`` (embeddings, pooling, scoring,
  tokenize, ...).
- ``form``: the same for a ``multipart/form-data`` body (audio transcription, translation).
- ``stored``: a stored Responses API response: sent to the backend that made it.
- ``any``: model-less and the same on every engine (``/version``): any usable backend.
- ``local``: answered by the router itself (``/health``, ``/metrics``, ``/v1/models``).
- ``engine``: acts on, or reports about, one engine (scaling, profiling, cache resets, sleep,
  weight updates, LoRA loading); the router does not guess which, and answers 404 naming the
  route (send it to the engine itself).

Any path not in the table is forwarded to a backend of its body's ``model``, or answered with
a 404 in vLLM's shape. Every forwarded route keeps the router's rules: authentication and
tenants, priorities, streaming, retries before the first byte.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

from kvstack.router.request import Endpoint

__all__ = ["ROUTES", "Route", "RouteMatch", "match_route"]

RouteKind = Literal["generate", "model", "form", "stored", "any", "local", "engine"]
FORWARDED: frozenset[RouteKind] = frozenset({"generate", "model", "form", "stored", "any"})


@dataclass(frozen=True, slots=True)
class Route:
    path: str  # as vLLM's schema writes it: /v1/responses/{response_id}
    methods: tuple[str, ...]
    kind: RouteKind
    endpoint: Endpoint = "other"

    @property
    def forwarded(self) -> bool:
        return self.kind in FORWARDED


def _post(kind: RouteKind, *paths: str) -> list[Route]:
    return [Route(path, ("POST",), kind) for path in paths]


MODEL_PATHS = (
    "/v1/messages/count_tokens", "/tokenize", "/detokenize",
    "/v1/embeddings", "/v2/embed", "/pooling", "/classify",
    "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
    "/generative_scoring", "/invocations", "/v1/systemone", "/inference/v1/generate",
    "/v1/completions/render", "/v1/chat/completions/render", "/v1/messages/render",
    "/v1/responses/render", "/v1/completions/derender", "/v1/chat/completions/derender",
)  # fmt: skip
ENGINE_POSTS = (
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/inference/v1/abort_requests",
    "/abort_requests", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
    # development mode (VLLM_SERVER_DEV_MODE=1), RL weight updates, fault tolerance, profiling
    "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/sleep", "/wake_up",
    "/release_kv_cache_memory", "/collective_rpc", "/pause", "/resume",
    "/init_weight_transfer_engine", "/shutdown_weight_transfer_engine", "/start_weight_update",
    "/start_draft_weight_update", "/finish_weight_update", "/update_weights",
    "/update_weight_version", "/weight_checker", "/fault_tolerance/apply",
    "/start_profile", "/stop_profile",
)  # fmt: skip
ENGINE_GETS = (
    "/load", "/kv_event_sources", "/server_info", "/is_sleeping", "/is_paused",
    "/get_world_size", "/weight_info", "/fault_tolerance/status", "/tokenizer_info",
)  # fmt: skip

ROUTES: tuple[Route, ...] = (
    Route("/v1/completions", ("POST",), "generate", "completions"),
    Route("/v1/chat/completions", ("POST",), "generate", "chat"),
    Route("/v1/responses", ("POST",), "generate", "responses"),
    Route("/v1/messages", ("POST",), "generate", "messages"),
    Route("/v1/chat/completions/batch", ("POST",), "generate", "chat_batch"),
    Route("/v1/responses/{response_id}", ("GET",), "stored"),
    Route("/v1/responses/{response_id}/cancel", ("POST",), "stored"),
    *_post("model", *MODEL_PATHS),
    *_post("form", "/v1/audio/transcriptions", "/v1/audio/translations"),
    Route("/version", ("GET",), "any"),
    Route("/health", ("GET",), "local"),
    Route("/ping", ("GET", "POST"), "local"),  # SageMaker's health check
    Route("/metrics", ("GET",), "local"),
    Route("/v1/models", ("GET",), "local"),
    *_post("engine", *ENGINE_POSTS),
    *(Route(path, ("GET",), "engine") for path in ENGINE_GETS),
)


class RouteMatch(NamedTuple):
    route: Route
    params: Mapping[str, str]  # path parameters ({response_id})


def _compile(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + "$")


_STATIC = {r.path: r for r in ROUTES if "{" not in r.path}
_TEMPLATED = [(_compile(r.path), r) for r in ROUTES if "{" in r.path]


def match_route(path: str) -> RouteMatch | None:
    """The route serving ``path``, with its path parameters; None for a path not in vLLM's
    schema (the router then forwards it by model, or answers 404)."""
    route = _STATIC.get(path)
    if route is not None:
        return RouteMatch(route, {})
    for pattern, templated in _TEMPLATED:
        found = pattern.match(path)
        if found is not None:
            return RouteMatch(templated, found.groupdict())
    return None
