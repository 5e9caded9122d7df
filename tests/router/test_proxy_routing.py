"""Policies, model routes, adapters, the load view and what the router exports."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp

from tests.router.conftest import RouterFactory, engines, until
from tests.router.fake_engine import FakeEngine

BODY = {"model": "toy", "prompt": "hi"}


async def _backend(
    http: aiohttp.ClientSession, url: str, body: object = BODY, **headers: str
) -> str:
    async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["x-kvstack-backend"]


async def test_round_robin_alternates(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    async with (
        engines(FakeEngine("a"), FakeEngine("b")) as fleet,
        run_router(fleet, policy="round_robin") as r,
    ):
        served = [await _backend(http, r.url) for _ in range(6)]
    assert served[0::2] == [served[0]] * 3 and served[1::2] == [served[1]] * 3
    assert served[0] != served[1]


async def test_least_load_spreads_a_burst_using_decision_time_accounting(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fleet = [FakeEngine(n, delay_s=1.0) for n in "abc"]  # all 12 in flight at once
    # Scraping off: the spread must come from the router's own in-flight counts.
    async with (
        engines(*fleet),
        run_router(fleet, policy="least_load", scrape={"enabled": False}) as r,
    ):
        served = await asyncio.gather(*(_backend(http, r.url) for _ in range(12)))
    assert sorted(Counter(served).values()) == [4, 4, 4]


async def test_least_load_uses_scraped_engine_queues(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    busy, idle = FakeEngine("busy", waiting_requests=20), FakeEngine("idle")
    async with engines(busy, idle), run_router([busy, idle], policy="least_load") as r:
        state = r.router.pool.get(busy.url)
        await until(lambda: state.engine is not None and bool(state.engine.waiting))
        served = [await _backend(http, r.url) for _ in range(5)]
        assert set(served) == {idle.url}
        async with http.get(f"{r.url}/metrics") as resp:
            text = await resp.text()
    assert f'kvstack_router_backend_engine_waiting{{backend="{busy.url}"}} 20.0' in text
    assert f'kvstack_router_backend_metrics_stale{{backend="{busy.url}"}} 0.0' in text


async def test_session_affinity_pins_and_yields_when_saturated(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fleet = [FakeEngine(n) for n in "abc"]
    pipeline = {
        "scorers": [
            {"name": "session_affinity", "weight": 2, "args": {"max_in_flight": 1}},
            {"name": "least_load"},
        ]
    }
    async with engines(*fleet), run_router(fleet, pipeline=pipeline, debug_headers=True) as r:
        pinned = {await _backend(http, r.url, **{"x-session-id": "s1"}) for _ in range(3)}
        assert len(pinned) == 1
        by_user = {await _backend(http, r.url, {**BODY, "user": "u7"}) for _ in range(3)}
        assert len(by_user) == 1
        spread = {await _backend(http, r.url, **{"x-session-id": f"s{i}"}) for i in range(30)}
        assert len(spread) == 3
        # Two at once for one session: the pinned backend holds one (max_in_flight 1), so the
        # second yields to least load.
        for engine in fleet:
            engine.delay_s = 0.2

        async def one() -> tuple[str, str]:
            async with http.post(
                f"{r.url}/v1/completions", json=BODY, headers={"x-session-id": "s1"}
            ) as resp:
                return resp.headers["x-kvstack-backend"], resp.headers["x-kvstack-decision"]

        first = asyncio.create_task(one())
        await until(lambda: sum(e.in_progress for e in fleet) == 1)  # it holds the pinned one
        second = await one()
        assert (await first)[0] in pinned and second[0] not in pinned
        assert "session_affinity=yield:in_flight" in second[1] and "reason=least_load" in second[1]


async def test_canary_weights_and_body_rewrite(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    v1, v2 = FakeEngine("v1", models=["support-v1"]), FakeEngine("v2", models=["support-v2"])
    routes = [
        {
            "name": "support",
            "targets": [
                {"model": "support-v1", "weight": 90},
                {"model": "support-v2", "weight": 10},
            ],
        }
    ]
    async with engines(v1, v2), run_router([v1, v2], models=routes) as r:
        body = {"model": "support", "prompt": "x", "temperature": 0.5}
        served = Counter([await _backend(http, r.url, body) for _ in range(400)])
        share = served[v2.url] / 400
        assert 0.05 <= share <= 0.15, share  # 10% ± 5 points (σ ≈ 1.5 points)
        assert v2.seen[-1].body == {**body, "model": "support-v2"}
        sticky = {await _backend(http, r.url, {**body, "user": "alice"}) for _ in range(20)}
        assert len(sticky) == 1


async def test_adapters_are_targets_and_models_lists_the_union_plus_aliases(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    a = FakeEngine("a", models=["base"])
    b = FakeEngine("b", models=["base"], adapters={"sql-lora": "base"})
    routes = [{"name": "sql", "targets": [{"model": "sql-lora"}]}]
    async with (
        engines(a, b),
        run_router([a, b], models=routes, model_aliases={"gpt-x": "base"}) as r,
    ):
        served = {await _backend(http, r.url, {"model": "sql", "prompt": "x"}) for _ in range(6)}
        assert served == {b.url}
        assert b.seen[-1].body["model"] == "sql-lora"
        served = {await _backend(http, r.url, {"model": "gpt-x", "prompt": "x"}) for _ in range(6)}
        assert served == {a.url, b.url}
        async with http.get(f"{r.url}/v1/models") as resp:
            ids = [m["id"] for m in (await resp.json())["data"]]
    assert sorted(ids) == ["base", "gpt-x", "sql", "sql-lora"]


async def test_metrics_are_prefixed_and_explain_decisions(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    async with engines(FakeEngine("a"), FakeEngine("b")) as fleet, run_router(fleet) as r:
        for stream in (False, True):
            await _backend(http, r.url, {**BODY, "stream": stream})
        async with http.get(f"{r.url}/metrics") as resp:
            text = await resp.text()
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"
    }
    assert not any(n.startswith("vllm:") for n in names)
    for wanted in (
        "kvstack_router_requests_total",
        "kvstack_router_decisions_total",
        "kvstack_router_added_latency_seconds_bucket",
        "kvstack_router_ttft_seconds_bucket",
        "kvstack_router_backend_in_flight",
        "kvstack_router_backend_metrics_age_seconds",
    ):
        assert wanted in names, wanted
    assert 'kvstack_router_decisions_total{reason="round_robin"}' in text
    assert (
        'kvstack_router_requests_total{backend="' + fleet[0].url + '",model="toy",status="200"}'
        in text
    )
