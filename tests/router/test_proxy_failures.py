"""Failures: retries before the first byte, ejection with a bounded lease, timeouts, 4xx."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from prometheus_client import REGISTRY

from tests.router.conftest import RouterFactory, engines, free_port, until
from tests.router.fake_engine import FakeEngine
from tests.router.vllm_schema import assert_vllm_error

BODY = {"model": "toy", "prompt": "hi"}


async def _post(http: aiohttp.ClientSession, url: str, body: object = BODY) -> tuple[int, dict]:
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        return resp.status, {"body": await resp.json(), **resp.headers}


async def test_5xx_before_first_byte_is_retried_elsewhere_and_the_backend_ejected(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    bad, good = FakeEngine("bad", fail_next=1000), FakeEngine("good")
    debug = {"debug_headers": True}  # the decision header shows the attempt number
    async with engines(bad, good), run_router([bad, good], policy="round_robin", **debug) as r:
        results = [await _post(http, r.url) for _ in range(8)]
    assert all(status == 200 for status, _ in results)
    assert all(h["body"]["choices"][0]["text"] == "from good" for _, h in results)
    assert any("attempt=2" in h["x-kvstack-decision"] for _, h in results)
    # Two failures in a row eject it (ejection.consecutive_failures = 2): no third try.
    assert len(bad.seen) == 2


async def test_connection_refused_is_retried_on_another_backend(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    gone, good = FakeEngine("gone"), FakeEngine("good")
    slow_health = {"health": {"interval_s": 30}}
    async with (
        engines(gone, good),
        run_router([gone, good], policy="round_robin", **slow_health) as r,
    ):
        await gone.stop()  # still "healthy" for the router until the next check
        results = [await _post(http, r.url) for _ in range(4)]
        assert [s for s, _ in results] == [200] * 4
        assert r.router.pool.get(gone.url).ejection.is_ejected(time.monotonic())


async def test_no_retry_left_relays_the_last_5xx_or_a_502(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    bad = FakeEngine("bad", fail_next=1000, fail_status=503)
    async with engines(bad), run_router([bad]) as r:
        status, headers = await _post(http, r.url)
        assert status == 503 and headers["body"] == {"error": {"message": "boom"}}
        await bad.stop()
        await until(lambda: r.router.pool.get(bad.url).healthy is False)  # health checks notice
        status, headers = await _post(http, r.url)
        assert status == 503 and headers["x-kvstack-error"] == "no_backend"
        assert_vllm_error(headers["body"], 503)


async def test_ejection_lease_is_bounded(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    flaky, good = FakeEngine("flaky", fail_next=2), FakeEngine("good")
    lease = {"ejection": {"base_lease_s": 1.0, "max_lease_s": 2.0}}
    async with engines(flaky, good), run_router([flaky, good], policy="round_robin", **lease) as r:
        for _ in range(4):
            await _post(http, r.url)
        state = r.router.pool.get(flaky.url)
        assert state.ejection.ejections == 1 and len(flaky.seen) == 2
        await asyncio.sleep(1.05)  # past the lease, however slow the posts above were
        served = {(await _post(http, r.url))[1]["x-kvstack-backend"] for _ in range(4)}
        assert flaky.url in served  # back after the lease, and healthy again
        assert not state.ejection.is_ejected(time.monotonic()) and state.ejection.failures == 0


async def test_a_lone_ejected_backend_still_serves_and_health_stays_green(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    flaky = FakeEngine("flaky", fail_next=2)
    lease = {"ejection": {"base_lease_s": 30, "max_lease_s": 30}, "retry": {"max_attempts": 1}}
    async with engines(flaky), run_router([flaky], **lease) as r:
        assert [(await _post(http, r.url))[0] for _ in range(2)] == [500, 500]
        assert r.router.pool.get(flaky.url).ejection.is_ejected(time.monotonic())
        panics = REGISTRY.get_sample_value("kvstack_router_panic_routing_total") or 0.0
        status, _ = await _post(http, r.url)
        assert status == 200  # every candidate ejected: route anyway, do not answer 503
        async with http.get(f"{r.url}/health") as resp:
            report = await resp.json()
            assert resp.status == 200 and report["backends"][flaky.url]["ejected"] is False
        assert REGISTRY.get_sample_value("kvstack_router_panic_routing_total") == panics + 1


async def test_first_byte_timeout_retries_then_gives_504(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    slow, fast = FakeEngine("slow", delay_s=0.4), FakeEngine("fast")
    timeouts = {"timeouts": {"first_byte_s": 0.1}}
    async with engines(slow, fast), run_router([slow, fast], policy="round_robin", **timeouts) as r:
        for _ in range(2):
            status, headers = await _post(http, r.url)
            assert status == 200 and headers["body"]["choices"][0]["text"] == "from fast"
    async with (
        engines(FakeEngine("slow", delay_s=0.4)) as (only,),
        run_router([only], **timeouts) as r,
    ):
        status, headers = await _post(http, r.url)
        assert status == 504 and headers["x-kvstack-error"] == "timeout"
        assert_vllm_error(headers["body"], 504)


async def test_total_timeout_cuts_a_long_stream_with_an_error_event(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a", chunk_delay_s=0.1, num_chunks=50)
    async with engines(engine), run_router([engine], timeouts={"total_s": 0.3}) as r:
        body = {**BODY, "stream": True}
        async with http.post(f"{r.url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            text = await resp.text()
        assert 'data: {"error"' in text and "total timeout" in text
        await until(lambda: engine.disconnects >= 1)  # at its next chunk, <= 0.1 s on
        assert engine.disconnects == 1


async def test_health_goes_503_when_all_backends_are_down_and_recovers(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    a, b = FakeEngine("a"), FakeEngine("b")
    async with engines(a, b), run_router([a, b]) as r:
        # Both up (a first check that timed out on a busy host is retried every 0.1 s).
        await _until_status(http, f"{r.url}/health", 200)
        await until(lambda: sum(bool(s.healthy) for s in r.router.pool.states()) == 2)
        async with http.get(f"{r.url}/health") as resp:
            assert resp.status == 200 and (await resp.json())["usable"] == 2
        a.healthy = False
        await b.stop()
        await _until_status(http, f"{r.url}/health", 503)
        await b.start()  # the same port again
        await _until_status(http, f"{r.url}/health", 200)
        status, _ = await _post(http, r.url)
        assert status == 200


async def _until_status(http: aiohttp.ClientSession, url: str, status: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        async with http.get(url) as resp:
            if resp.status == status:
                return
        assert time.monotonic() < deadline, f"{url} never answered {status}"
        await asyncio.sleep(0.05)


async def test_a_dead_backend_s_503_says_connection_refused(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with run_router([dead]) as r:
        await until(lambda: bool(r.router.pool.states()[0].last_error))
        status, answer = await _post(http, r.url)
    assert status == 503
    assert f"connection refused to {dead}" in answer["body"]["error"]["message"]
