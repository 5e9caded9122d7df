"""Requests the router refuses itself, with OpenAI-style errors; API keys and tenants."""

from __future__ import annotations

import os
import time
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.router.conftest import RouterFactory, engines, until
from tests.router.fake_engine import FakeEngine


@pytest.mark.parametrize(
    ("path", "raw", "status", "param", "code"),
    [
        ("/v1/completions", b'{"model": "toy", "prompt": ', 400, None, "invalid_json"),
        ("/v1/completions", b"[1, 2]", 400, None, "invalid_json"),
        ("/v1/completions", b'{"prompt": "x"}', 400, "model", None),
        ("/v1/completions", b'{"model": "toy"}', 400, "prompt", None),
        (
            "/v1/completions",
            b'{"model": "toy", "prompt": "x", "stream": "yes"}',
            400,
            "stream",
            None,
        ),
        ("/v1/chat/completions", b'{"model": "toy"}', 400, "messages", None),
        (
            "/v1/chat/completions",
            b'{"model": "toy", "messages": [{"content": "x"}]}',
            400,
            "messages.0",
            None,
        ),
        ("/v1/completions", b'{"model": "nope", "prompt": "x"}', 404, "model", "model_not_found"),
    ],
)
async def test_bad_requests_get_openai_style_errors(
    run_router: RouterFactory,
    http: aiohttp.ClientSession,
    path: str,
    raw: bytes,
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine]) as r:
        async with http.post(r.url + path, data=raw) as resp:
            assert resp.status == status
            error = (await resp.json())["error"]
        assert error["param"] == param and error["code"] == code
        assert error["type"] == "invalid_request_error" and error["message"]
        assert engine.seen == []
    if status == 404:
        assert "known models: toy" in error["message"]


async def test_request_size_limit(run_router: RouterFactory, http: aiohttp.ClientSession) -> None:
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine], limits={"max_request_bytes": "1KiB"}) as r:
        big = {"model": "toy", "prompt": "x" * 2000}
        async with http.post(f"{r.url}/v1/completions", json=big) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["code"] == "request_too_large"
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
        async with http.get(f"{r.url}/v1/embeddings") as resp:
            assert (
                resp.status == 404 and "/v1/completions" in (await resp.json())["error"]["message"]
            )
        async with http.get(f"{r.url}/v1/completions") as resp:
            assert resp.status == 405 and resp.headers["allow"] == "POST"
