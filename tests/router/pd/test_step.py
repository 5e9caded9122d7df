"""Prefill/decode routing through a live router in front of fake engines: the prefill step's
body, the decode request unchanged, the per-request decision, failures costing only time."""

from __future__ import annotations

from typing import Any

import aiohttp

from kvstack.router.config import RouterConfig
from tests.router.conftest import engines, router_config, serve_router
from tests.router.fake_engine import FakeEngine

LONG = "word " * 600  # ~750 tokens by character blocks


def pd_config(prefill: FakeEngine, decode: FakeEngine, **pd: Any) -> RouterConfig:
    # debug_headers: the test reads the prefill note of the decision header
    config = router_config([prefill, decode], pd={"models": ["toy"], **pd}, debug_headers=True)
    config.backends[0].role = "prefill"
    config.backends[1].role = "decode"
    return config


async def stream(http: aiohttp.ClientSession, url: str, prompt: str) -> tuple[int, str, str]:
    body = {"model": "toy", "prompt": prompt, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with http.post(f"{url}/v1/completions", json=body) as r:
        text = await r.text()
        return r.status, r.headers.get("x-kvstack-decision", ""), text


async def test_long_prompts_prefill_remotely_then_decode(http: aiohttp.ClientSession) -> None:
    prefill, decode = FakeEngine("prefill"), FakeEngine("decode")
    async with engines(prefill, decode), serve_router(pd_config(prefill, decode)) as r:
        status, decision, text = await stream(http, r.url, LONG)
        assert status == 200 and "decode:" in text and "prefill:" not in text
        assert f"pd=remote:{prefill.url}" in decision
        [step] = prefill.seen
        assert step.body["max_tokens"] == 1 and step.body["stream"] is False
        assert "stream_options" not in step.body and step.body["prompt"] == LONG
        [answer] = decode.seen
        assert answer.body["stream"] is True and answer.body["max_tokens"] == 5


async def test_short_suffixes_and_failed_prefills_decode_in_place(
    http: aiohttp.ClientSession,
) -> None:
    prefill, decode = FakeEngine("prefill"), FakeEngine("decode")
    async with (
        engines(prefill, decode),
        serve_router(pd_config(prefill, decode, min_remote_prefill_tokens=400)) as r,
    ):
        status, decision, _ = await stream(http, r.url, "a short question")
        assert status == 200 and "pd=short_suffix" in decision and not prefill.seen
        prefill.fail_next, prefill.fail_status = 1, 500
        status, decision, text = await stream(http, r.url, LONG)
        assert status == 200 and "decode:" in text and "pd=failed:" in decision
        assert len(decode.seen) == 2
