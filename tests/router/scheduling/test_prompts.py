"""Prompt rendering for routing: the engine's tokens, whole conversations, namespaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.errors import ConfigError
from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.config import PrefixConfig
from kvstack.router.scheduling.prompts import PromptRenderer, split_target
from kvstack.router.scheduling.tokenizers import CharBlocks, HFTokenizer, make_tokenizer
from kvstack.sim.tokenizer import SimTokenizer


def chat(messages: list[dict[str, str]], **body: object) -> RoutingRequest:
    return RoutingRequest(
        request_id="r",
        endpoint="chat",
        model="m",
        target="m",
        messages=messages,
        body={"messages": messages, **body},
    )


def completion(prompt: object, target: str = "m") -> RoutingRequest:
    ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    token_ids = prompt if ids else None
    return RoutingRequest(
        request_id="r",
        endpoint="completions",
        model=target,
        target=target,
        prompt=prompt,  # type: ignore[arg-type]
        token_ids=token_ids,  # type: ignore[arg-type]
    )


def test_sim_tokens_equal_the_simulators() -> None:
    renderer = PromptRenderer(PrefixConfig(tokenizers={"m": "sim"}))
    renderer._tokenizers["m"] = make_tokenizer("sim")
    messages = [{"role": "system", "content": "t100 t101"}, {"role": "user", "content": "hi"}]
    rendered = renderer.render(chat(messages), [])
    assert rendered.exact and rendered.tokens == SimTokenizer(32000).apply_chat_template(messages)
    assert renderer.render(completion("t20 t21 t22"), []).tokens == [20, 21, 22]


def test_chat_is_keyed_on_the_whole_conversation_not_the_first_message() -> None:
    renderer = PromptRenderer()  # character blocks: approximate, but the whole history
    system = {"role": "system", "content": "You are a helpful assistant. " * 4}
    a = renderer.render(chat([system, {"role": "user", "content": "question one"}]), [])
    b = renderer.render(chat([system, {"role": "user", "content": "question two"}]), [])
    assert not a.exact and a.namespace.model == "chars:m"
    assert a.tokens != b.tokens
    shared = next(i for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y)
    assert shared >= len(system["content"]) // 4  # the common system prompt is a common prefix


def test_namespaces_follow_adapter_and_salt() -> None:
    base = BackendState(Backend("a", "http://a:1", static_models=frozenset({"m", "lora1"})))
    base.set_models([{"id": "m"}, {"id": "lora1", "parent": "m"}], 0.0)
    assert split_target("lora1", [base]) == ("m", "lora1")
    assert split_target("m", [base]) == ("m", "")
    renderer = PromptRenderer()
    salted = chat([{"role": "user", "content": "x"}], cache_salt="tenant-a")
    assert renderer.render(salted, [base]).namespace.salt == "tenant-a"
    adapted = completion("hello", target="lora1")
    assert renderer.render(adapted, [base]).namespace.adapter == "lora1"
    assert renderer.render(completion([5, 6, 7]), []).tokens == [5, 6, 7]


def test_char_blocks_are_prefix_preserving() -> None:
    blocks = CharBlocks()
    assert blocks.completion("abcdefgh")[:2] == blocks.completion("abcdefghij")[:2]
    assert len(blocks.completion("x" * 400)) == 100


def test_bad_tokenizer_specs_are_named() -> None:
    with pytest.raises(ConfigError, match="sim:VOCAB_SIZE"):
        make_tokenizer("sim:lots")
    with pytest.raises(ConfigError, match="/nonexistent/model"):
        make_tokenizer("/nonexistent/model")


async def test_renderer_loads_model_tokenizers_off_the_loop(toy_model: Path) -> None:
    renderer = PromptRenderer(PrefixConfig(tokenizers={"toy": str(toy_model)}))
    await renderer.start()
    tok = renderer.tokenizer("toy")
    assert isinstance(tok, HFTokenizer) and tok.exact
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(toy_model)
    messages = [{"role": "user", "content": "cache aware routing"}]
    expected = reference.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True
    )
    assert tok.chat(messages) == list(expected["input_ids"])
    assert tok.completion("cache block") == reference.encode("cache block")
