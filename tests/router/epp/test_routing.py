"""What the EPP decides is the router's decision: prefix affinity, the subset hint, adapter
affinity, shedding by priority (InferenceObjective bands), model rewrites for canary routes."""

from __future__ import annotations

import json
from collections import Counter

import httpx

from tests.router.conftest import engines, until
from tests.router.epp.conftest import RunningEpp, serve_epp
from tests.router.epp.envoy import FULL_DUPLEX
from tests.router.fake_engine import FakeEngine

PATH = "/v1/completions"
DONE = [b'{"model": "toy", "choices": [{"text": "x"}]}']


def prompt(prefix: str, suffix: str) -> dict[str, object]:
    return {"model": "toy", "prompt": f"{prefix * 200} {suffix}", "max_tokens": 4}


async def served(epp: RunningEpp, body: dict[str, object], **kwargs: object) -> str | None:
    """One whole request through the EPP (the answer faked); the endpoint it picked."""
    async with epp.envoy.stream(FULL_DUPLEX, FULL_DUPLEX) as s:
        answer = await s.send_request(PATH, body, **kwargs)  # type: ignore[arg-type]
        if answer.status is None:
            await s.send_response(200, DONE)
        return answer.endpoint


async def test_picks_land_on_the_endpoint_holding_the_prefix() -> None:
    fleet = [FakeEngine(n) for n in "abc"]
    async with engines(*fleet) as started, serve_epp(started) as epp:
        first = {p: await served(epp, prompt(p, "q0")) for p in ("alpha ", "bravo ", "charlie ")}
        assert len(set(first.values())) == 3  # an idle fleet spreads new prefixes
        for round_ in range(1, 4):
            for p, endpoint in first.items():
                assert await served(epp, prompt(p, f"q{round_}")) == endpoint


async def test_the_subset_hint_is_obeyed_over_the_prefix() -> None:
    fleet = [FakeEngine(n) for n in "abc"]
    async with engines(*fleet) as started, serve_epp(started) as epp:
        home = await served(epp, prompt("delta ", "q0"))
        others = [epp.endpoint(e) for e in started if epp.endpoint(e) != home]
        for _ in range(3):
            assert await served(epp, prompt("delta ", "q1"), subset=others[:1]) == others[0]
        two = set(others)
        picks = {await served(epp, prompt("delta ", f"q{i}"), subset=sorted(two)) for i in range(4)}
        assert picks <= two
        outside = await epp.envoy.pick(PATH, prompt("delta ", "q"), subset=["10.9.9.9:1"])
        assert outside.status == 503
        empty = await epp.envoy.pick(PATH, prompt("delta ", "q"), subset=[])
        assert empty.status == 503


async def test_an_adapter_request_goes_where_the_adapter_is_active() -> None:
    adapters = {"sql-lora": "toy"}
    a = FakeEngine("a", adapters=adapters, max_loras=1, running_adapters=["other-lora"])
    b = FakeEngine("b", adapters=adapters, max_loras=1, running_adapters=["sql-lora"])
    async with engines(a, b) as started, serve_epp(started) as epp:
        await until(lambda: all(s.engine for s in epp.server.router.pool.states()))
        body = {"model": "sql-lora", "prompt": "select", "max_tokens": 2}
        picks = Counter([await served(epp, body) for _ in range(6)])
        assert picks == Counter({epp.endpoint(b): 6})
        base = {"model": "toy", "prompt": "select", "max_tokens": 2}
        assert len({await served(epp, base) for _ in range(4)}) == 2  # base: no preference


async def test_sheddable_requests_are_shed_under_saturation_and_critical_go() -> None:
    a = FakeEngine("a", waiting_requests=50)  # the engine's queue is far past saturation
    admission = {"name": "priority", "args": {"retry_after_s": 3}}
    async with engines(a) as started, serve_epp(started, admission=admission) as epp:
        await until(lambda: epp.server.router.pool.states()[0].engine is not None)
        epp.server.picker.objectives.objectives = {"batch": "sheddable", "chat": "critical"}
        shed = await epp.envoy.pick(PATH, prompt("e ", "q"), headers=_objective("batch"))
        assert shed.status == 429 and shed.headers["retry-after"] == "3"
        assert shed.headers["x-kvstack-error"] == "overloaded"
        assert await served(epp, prompt("e ", "q"), headers=_objective("chat")) == epp.endpoint(a)
        a.waiting_requests = 0
        state = epp.server.router.pool.states()[0]
        await until(lambda: state.engine is not None and state.engine.waiting == 0)
        assert await served(epp, prompt("e ", "q"), headers=_objective("batch"))


def _objective(name: str) -> dict[str, str]:
    return {"x-gateway-inference-objective": name}


async def test_a_canary_route_rewrites_the_model_and_content_length() -> None:
    v1, v2 = FakeEngine("v1", models=["toy-v1"]), FakeEngine("v2", models=["toy-v2"])
    route = {"name": "toy", "targets": [{"model": "toy-v1"}, {"model": "toy-v2"}]}
    async with (
        engines(v1, v2) as started,
        serve_epp(started, models=[route]) as epp,
        httpx.AsyncClient() as http,
    ):
        served_by = Counter()
        for i in range(12):
            body = {"model": "toy", "prompt": f"hello {i}", "max_tokens": 2}
            done = await epp.envoy.forward(PATH, body, http)
            answer = done.answer
            assert done.status == 200, done.body  # the engine knows only its own model name
            target = answer.json["model"]
            assert target in ("toy-v1", "toy-v2")
            assert answer.headers["content-length"] == str(len(answer.body))
            expected = epp.endpoint(v1 if target == "toy-v1" else v2)
            assert answer.endpoint == expected
            served_by[target] += 1
        assert set(served_by) == {"toy-v1", "toy-v2"}  # both arms of the canary ran


async def test_a_tenants_request_reaches_the_engine_with_its_derived_salt() -> None:
    """Through the EPP too, tenants never share KV: the body Envoy forwards carries the salt
    the router derives for the caller's tenant, not the client's own."""
    engine = FakeEngine("e1")
    auth = {"api_keys": [{"key": "k-a", "tenant": "a"}, {"key": "k-b", "tenant": "b"}]}
    async with (
        engines(engine) as started,
        serve_epp(started, auth=auth) as epp,
        httpx.AsyncClient() as http,
    ):
        salts = []
        for key in ("k-a", "k-b", "k-a"):
            body = {"model": "toy", "prompt": "same words", "max_tokens": 2, "cache_salt": "x"}
            done = await epp.envoy.forward(
                PATH, body, http, headers={"authorization": f"Bearer {key}"}
            )
            assert done.status == 200, done.body
            salts.append(engine.seen[-1].body["cache_salt"])
        assert salts[0] == salts[2] != salts[1] and "x" not in salts


async def test_kv_transfer_params_reach_the_engine_only_from_the_admin() -> None:
    """A caller's orders to the engine's KV connector are dropped on the scored paths and the
    passthrough ones alike; the admin key's caller keeps them."""
    engine = FakeEngine("e1")
    orders = {"kvstack": {"load_mode": "sync"}}
    admin = {"x-kvstack-admin-key": "the-admin-key"}
    async with (
        engines(engine) as started,
        serve_epp(started, auth={"admin_key": "the-admin-key"}) as epp,
        httpx.AsyncClient() as http,
    ):
        seen = []
        for headers in ({}, admin):
            body = {"model": "toy", "prompt": "hi", "max_tokens": 2, "kv_transfer_params": orders}
            done = await epp.envoy.forward(PATH, body, http, headers=headers)
            assert done.status == 200, done.body
            seen.append(engine.seen[-1].body.get("kv_transfer_params"))
        assert seen == [None, orders]
        body = {"model": "toy", "token_ids": [1, 2], "kv_transfer_params": orders}
        passed = await epp.envoy.pick("/inference/v1/generate", body)
        assert passed.status is None and passed.endpoint == epp.endpoint(engine)
        assert json.loads(passed.body) == {"model": "toy", "token_ids": [1, 2]}
        assert passed.headers["content-length"] == str(len(passed.body))
