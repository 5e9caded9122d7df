"""``PromptRenderer``: each request's prompt as token ids, rendered once, in its namespace.

Chat prompts are rendered whole (template, every message, generation prompt) — never keyed on
the first message — and completions as the engine tokenizes them; a client's token-id prompt is
used as is. The namespace keeps KV of different base models, LoRA adapters and cache salts
apart; approximate (character-block) tokens live in their own namespaces, so they never meet
exact ids. Model tokenizers are loaded once, at start, on a worker thread; long prompts are
tokenized on a worker thread too, so the event loop never stalls on a tokenizer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from kvstack.index.radix import RadixNamespace
from kvstack.router.fleet.backends import BackendView
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.config import PrefixConfig
from kvstack.router.scheduling.tokenizers import (
    CharBlocks,
    PromptTokenizer,
    PromptTokens,
    make_tokenizer,
)

__all__ = ["PromptRenderer", "split_target"]

log = logging.getLogger(__name__)


def _base_and_adapter(request: RoutingRequest, backends: Sequence[BackendView]) -> tuple[str, str]:
    """A request resolved by the adapter control plane targets its base model; its KV lives
    under the adapter's engine-side name (``adapter_id@version``), as vLLM's events name it."""
    resolution = request.state.adapter
    if resolution is not None:
        return request.target, resolution.engine_name
    return split_target(request.target, backends)


def split_target(target: str, backends: Sequence[BackendView]) -> tuple[str, str]:
    """(base model, adapter or ""): an adapter is a target some backend lists with a parent."""
    for backend in backends:
        base = backend.adapters.get(target)
        if base is not None:
            return base, target
    return target, ""


class PromptRenderer:
    def __init__(self, config: PrefixConfig | None = None) -> None:
        self.config = config or PrefixConfig()
        self._fallback: PromptTokenizer = CharBlocks()
        self._tokenizers: dict[str, PromptTokenizer] = {}

    async def start(self) -> None:
        """Load every configured tokenizer (a bad path fails the start, naming it)."""
        specs = {**self.config.tokenizers}
        for model, spec in specs.items():
            self._tokenizers[model] = await asyncio.to_thread(make_tokenizer, spec)
            log.info("tokenizer for %s: %s", model, spec)
        self._fallback = await asyncio.to_thread(make_tokenizer, self.config.default_tokenizer)

    async def close(self) -> None:
        return None

    def tokenizer(self, model: str) -> PromptTokenizer:
        return self._tokenizers.get(model, self._fallback)

    async def prepare(self, request: RoutingRequest, backends: Sequence[BackendView]) -> None:
        """Render ``request`` into ``request.state.prompt`` (a worker thread for long prompts)."""
        if request.state.prompt is not None:
            return
        base, adapter = _base_and_adapter(request, backends)
        tokenizer = self.tokenizer(base)
        if len(request.text) > tokenizer.inline_chars:
            rendered = await asyncio.to_thread(self._render, request, base, adapter, tokenizer)
        else:
            rendered = self._render(request, base, adapter, tokenizer)
        request.state.prompt = rendered

    def render(self, request: RoutingRequest, backends: Sequence[BackendView]) -> PromptTokens:
        """The rendered prompt (memoized; rendered here, on the caller's thread, if needed)."""
        rendered = request.state.prompt
        if rendered is None:
            base, adapter = _base_and_adapter(request, backends)
            rendered = self._render(request, base, adapter, self.tokenizer(base))
            request.state.prompt = rendered
        return rendered

    def _render(
        self, request: RoutingRequest, base: str, adapter: str, tokenizer: PromptTokenizer
    ) -> PromptTokens:
        salt = request.body.get("cache_salt")
        salt = salt if isinstance(salt, str) else ""
        tokens, exact = self._tokens(request, tokenizer)
        model = base if exact else f"chars:{base}"
        return PromptTokens(tokens, RadixNamespace(model, adapter, salt), exact)

    def _tokens(
        self, request: RoutingRequest, tokenizer: PromptTokenizer
    ) -> tuple[list[int], bool]:
        if request.token_ids is not None:
            return request.token_ids, True
        if request.messages is not None:
            return _safe(tokenizer.chat, request.messages, tokenizer)
        prompt = request.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            return list(prompt[0]), True  # a batch of token-id prompts: route on the first
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]  # a batch of strings: route on the first
        return _safe(tokenizer.completion, prompt if isinstance(prompt, str) else "", tokenizer)


def _safe(
    fn: object, value: str | Sequence[Mapping[str, object]], tokenizer: PromptTokenizer
) -> tuple[list[int], bool]:
    """Tokenize; a prompt the tokenizer rejects (an odd chat message) falls back to character
    blocks: the engine will answer the error, routing must not."""
    try:
        return fn(value), tokenizer.exact  # type: ignore[operator]
    except (ValueError, TypeError, KeyError) as exc:
        log.debug("tokenizer rejected a prompt (%s); character blocks instead", exc)
        blocks = CharBlocks()
        if isinstance(value, str):
            return blocks.completion(value), False
        return blocks.chat(value), False
