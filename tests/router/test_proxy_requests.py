"""Requests the router refuses itself, with vLLM's errors; API keys and tenants."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.router.conftest import RouterFactory, engines, until
from tests.router.fake_engine import FakeEngine
from tests.router.vllm_schema import assert_vllm_error


@pytest.mark.parametrize(
    ("raw", "status", "param", "kind", "reason"),
    [
        (b'{"model": "toy", "prompt": ', 400, "body", "Bad Request", "invalid_json"),
        (b"[1, 2]", 400, "body", "Bad Request", "invalid_json"),
        (b'{"prompt": "x"}', 400, "model", "BadRequestError", "no_model"),
        (b'{"model": 5, "prompt": "x"}', 400, "body.model", "Bad Request", None),
        (b'{"model": "nope", "prompt": "x"}', 404, "model", "NotFoundError", "model_not_found"),
    ],
)
async def test_what_the_router_cannot_route_gets_vllms_errors(
    run_router: RouterFactory,
    http: aiohttp.ClientSession,
    raw: bytes,
    status: int,
    param: str,
    kind: str,
    reason: str | None,
) -> None:
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine]) as r:
        async with http.post(r.url + "/v1/completions", data=raw) as resp:
            assert resp.status == status
            body = await resp.json()
            assert resp.headers.get("x-kvstack-error") == reason
        assert_vllm_error(body, status)
        assert (body["error"]["param"], body["error"]["type"]) == (param, kind)
        assert engine.seen == []
    if status == 404:
        assert "known models: toy" in body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "toy"}),  # no prompt: the engine says so
        ("/v1/completions", {"model": "toy", "prompt": "x", "stream": "yes"}),  # vLLM: true
        ("/v1/completions", {"model": "toy", "prompt": [True], "max_tokens": "3"}),
        ("/v1/chat/completions", {"model": "toy", "messages": [{"content": "x"}]}),
    ],
)
async def test_what_only_the_engine_can_judge_is_forwarded(
    run_router: RouterFactory, http: aiohttp.ClientSession, path: str, body: dict[str, Any]
) -> None:
    """vLLM's own validation decides (its pydantic models accept ``"stream": "yes"``): the
    router refuses nothing the engine might serve."""
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine]) as r:
        async with http.post(r.url + path, json=body) as resp:
            assert resp.status == 200
            await resp.read()
        assert [seen.body for seen in engine.seen] == [body]


async def test_request_size_limit(run_router: RouterFactory, http: aiohttp.ClientSession) -> None:
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine], limits={"max_request_bytes": "1KiB"}) as r:
        big = {"model": "toy", "prompt": "x" * 2000}
        async with http.post(f"{r.url}/v1/completions", json=big) as resp:
            assert resp.status == 413
            assert resp.headers["x-kvstack-error"] == "request_too_large"
            assert_vllm_error(await resp.json(), 413)
        async with http.post(
            f"{r.url}/v1/completions", json={"model": "toy", "prompt": "x"}
        ) as resp:
            assert resp.status == 200


async def test_api_keys_from_config_and_file_map_to_tenants(
    run_router: RouterFactory, tmp_path: Path
) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# key tenant\nfile-key team-b\n")
    auth = {"api_keys": [{"key": "cfg-key", "tenant": "team-a"}], "api_keys_file": str(keys_file)}
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine], auth=auth) as r:
        for key, tenant in (("cfg-key", "team-a"), ("file-key", "team-b")):
            client = openai.AsyncOpenAI(base_url=f"{r.url}/v1", api_key=key, max_retries=0)
            await client.completions.create(model="toy", prompt="x")
            await client.close()
            assert engine.seen[-1].headers["x-kvstack-tenant"] == tenant
            assert "authorization" not in engine.seen[-1].headers  # the key stays here
        bad = openai.AsyncOpenAI(base_url=f"{r.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.completions.create(model="toy", prompt="x")
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        await bad.close()
        keys_file.write_text("new-key team-c\n")
        os.utime(keys_file, (time.time() + 5, time.time() + 5))  # a new mtime, even on 1 s clocks
        await until(lambda: r.router.auth._mtime == keys_file.stat().st_mtime)  # health loop
        client = openai.AsyncOpenAI(base_url=f"{r.url}/v1", api_key="new-key", max_retries=0)
        await client.completions.create(model="toy", prompt="x")
        await client.close()
        assert engine.seen[-1].headers["x-kvstack-tenant"] == "team-c"
        assert len(engine.seen) == 3


async def test_unknown_path_and_wrong_method(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine]) as r:
        async with http.get(f"{r.url}/v1/nothing-here") as resp:
            assert (
                resp.status == 404 and "/v1/nothing-here" in (await resp.json())["error"]["message"]
            )
            assert_vllm_error(await resp.json(), 404)
        async with http.get(f"{r.url}/v1/completions") as resp:
            assert resp.status == 405 and resp.headers["allow"] == "POST"
            assert_vllm_error(await resp.json(), 405)
