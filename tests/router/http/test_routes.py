"""Every route of vLLM's OpenAPI schemas, through the router: forwarded with its method, path
and body to a backend of the model, answered by the router, or refused in vLLM's shape.

The schemas are vLLM's own (``tests/router/data``, ``scripts/vllm-openapi.py``): a route a new
vLLM adds fails ``test_every_vllm_route_is_in_the_route_table`` until the table serves it.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from kvstack.router.http.routes import ROUTES, match_route
from tests.router.conftest import RouterFactory, engines
from tests.router.fake_engine import FakeEngine
from tests.router.vllm_schema import assert_vllm_error, schema_routes

ROUTE_IDS = sorted(schema_routes())
MODEL_ROUTES = [
    (path, method)
    for path, method in ROUTE_IDS
    if (found := match_route(path)) is not None and found.route.kind in ("generate", "model")
]


def test_every_vllm_route_is_in_the_route_table() -> None:
    missing = [
        f"{method} {path}"
        for path, method in ROUTE_IDS
        if (found := match_route(path)) is None or method not in found.route.methods
    ]
    assert not missing, f"vLLM routes the router does not know: {missing}"
    assert len(ROUTE_IDS) >= 40  # the three schemas together (22 in the generate server's)


def test_the_table_names_each_route_once() -> None:
    paths = [route.path for route in ROUTES]
    assert len(paths) == len(set(paths))


@pytest.mark.parametrize(("path", "method"), MODEL_ROUTES)
async def test_model_routes_reach_a_backend_of_the_model(
    run_router: RouterFactory, http: aiohttp.ClientSession, path: str, method: str
) -> None:
    toy, other = FakeEngine("toy-engine"), FakeEngine("other", models=["other"])
    body = {"model": "other", "input": "x", "messages": [{"role": "user", "content": "x"}]}
    async with (
        engines(toy, other),
        run_router([toy, other]) as r,
        http.post(r.url + path + "?trace=1", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        assert resp.headers["x-kvstack-backend"] == other.url
    assert toy.seen == []
    assert [(s.path, s.method, s.body) for s in other.seen] == [(path + "?trace=1", "POST", body)]


async def test_audio_forms_are_forwarded_by_their_model_field_byte_for_byte(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    toy, whisper = FakeEngine("toy-engine"), FakeEngine("whisper", models=["whisper"])
    audio = bytes(range(256)) * 64  # binary, with CR/LF and boundary-like bytes inside
    async with (
        engines(toy, whisper),
        run_router([toy, whisper], model_aliases={"w": "whisper"}) as r,
    ):
        for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            form = aiohttp.FormData()
            form.add_field("model", "w")  # an alias: the router rewrites the field
            form.add_field("file", audio, filename="a.wav", content_type="audio/wav")
            form.add_field("language", "en")
            async with http.post(r.url + path, data=form) as resp:
                assert resp.status == 200, await resp.text()
    assert toy.seen == [] and [s.path for s in whisper.seen] == [
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    ]
    for seen in whisper.seen:
        assert seen.headers["content-type"].startswith("multipart/form-data")
        assert audio in seen.raw and b'name="model"\r\n\r\nwhisper\r\n' in seen.raw
        assert b'name="language"\r\n\r\nen\r\n' in seen.raw


@pytest.mark.parametrize("stream", [False, True])
async def test_stored_responses_go_to_the_backend_that_holds_them(
    run_router: RouterFactory, http: aiohttp.ClientSession, stream: bool
) -> None:
    a, b = FakeEngine("a"), FakeEngine("b")
    async with engines(a, b), run_router([a, b], policy="round_robin") as r:
        made: dict[str, str] = {}
        for i in range(4):  # round robin: both engines make responses
            body = {"model": "toy", "input": f"q{i}", "stream": stream}
            async with http.post(r.url + "/v1/responses", json=body) as resp:
                text = await resp.text()
                made[_response_id(text)] = resp.headers["x-kvstack-backend"]
        assert set(made.values()) == {a.url, b.url}
        for response_id, backend in made.items():
            async with http.get(f"{r.url}/v1/responses/{response_id}?stream=false") as resp:
                assert resp.status == 200 and resp.headers["x-kvstack-backend"] == backend
            async with http.post(f"{r.url}/v1/responses/{response_id}/cancel") as resp:
                assert resp.status == 200 and resp.headers["x-kvstack-backend"] == backend
            follow = {"model": "toy", "input": "more", "previous_response_id": response_id}
            async with http.post(r.url + "/v1/responses", json=follow) as resp:
                assert resp.status == 200 and resp.headers["x-kvstack-backend"] == backend
        async with http.get(f"{r.url}/v1/responses/resp_unknown") as resp:
            assert resp.status == 404
            assert_vllm_error(await resp.json(), 404)
    gets = [s for s in a.seen + b.seen if s.method == "GET"]
    assert len(gets) == 4 and all(s.path.endswith("?stream=false") for s in gets)


def _response_id(text: str) -> str:
    if text.startswith("event:"):  # a stream: the id is in the response.created event
        text = text.split("data: ", 1)[1].split("\n", 1)[0]
        return str(json.loads(text)["response"]["id"])
    return str(json.loads(text)["id"])


async def test_stored_responses_are_the_tenants_own(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a")
    keys = {"api_keys": [{"key": "ka", "tenant": "ta"}, {"key": "kb", "tenant": "tb"}]}
    async with engines(engine), run_router([engine], auth=keys) as r:
        mine = {"authorization": "Bearer ka"}
        body = {"model": "toy", "input": "q"}
        async with http.post(r.url + "/v1/responses", json=body, headers=mine) as resp:
            response_id = (await resp.json())["id"]
        async with http.get(f"{r.url}/v1/responses/{response_id}", headers=mine) as resp:
            assert resp.status == 200
        theirs = {"authorization": "Bearer kb"}
        async with http.get(f"{r.url}/v1/responses/{response_id}", headers=theirs) as resp:
            assert resp.status == 404
        async with http.get(f"{r.url}/v1/responses/{response_id}") as resp:
            assert resp.status == 401
            assert_vllm_error(await resp.json(), 401)


async def test_local_any_and_engine_only_routes(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine]) as r:
        for path in ("/health", "/ping", "/metrics", "/v1/models"):
            async with http.get(r.url + path) as resp:
                assert resp.status == 200, path
        async with http.post(r.url + "/ping") as resp:
            assert resp.status == 200
        async with http.get(r.url + "/version") as resp:
            assert resp.status == 200 and resp.headers["x-kvstack-backend"] == engine.url
        engine_only = [r for r in ROUTES if r.kind == "engine"]
        for route in engine_only:
            async with http.request(route.methods[0], r.url + route.path) as resp:
                assert resp.status == 404 and resp.headers["x-kvstack-error"] == "engine_route"
                assert_vllm_error(await resp.json(), 404)
    assert [s.path for s in engine.seen] == ["/version"]


async def test_other_paths_go_by_model_or_get_vllms_404(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a")
    async with engines(engine), run_router([engine]) as r:
        async with http.post(r.url + "/v1/some/new/route", json={"model": "toy"}) as resp:
            assert (
                resp.status == 200 and (await resp.json())["echo"]["path"] == "/v1/some/new/route"
            )
        for body in ({"input": "no model"}, None):
            async with http.post(r.url + "/v1/some/new/route", json=body) as resp:
                assert resp.status == 404 and resp.headers["x-kvstack-error"] == "unknown_path"
                assert_vllm_error(await resp.json(), 404)
        async with http.post(r.url + "/v1/embeddings", json={"model": "nope"}) as resp:
            assert resp.status == 404
            assert_vllm_error(await resp.json(), 404)


async def test_every_route_keeps_retries_priorities_and_tenants(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    bad, good = FakeEngine("bad", fail_next=100, fail_status=503), FakeEngine("good")
    keys = {"api_keys": [{"key": "k", "tenant": "team"}]}
    admission = {"name": "priority"}
    async with (
        engines(bad, good),
        run_router([bad, good], policy="round_robin", auth=keys, admission=admission) as r,
    ):
        headers = {"authorization": "Bearer k", "x-kvstack-priority": "critical"}
        for _ in range(3):
            body: dict[str, Any] = {"model": "toy", "input": "x"}
            async with http.post(r.url + "/v1/embeddings", json=body, headers=headers) as resp:
                assert resp.status == 200 and resp.headers["x-kvstack-backend"] == good.url
        async with http.post(r.url + "/tokenize", json={"model": "toy"}) as resp:
            assert resp.status == 401
    assert all(s.headers["x-kvstack-tenant"] == "team" for s in good.seen)
    assert "authorization" not in good.seen[0].headers  # client keys are not forwarded
