"""Priorities and shedding through a live router in front of fake engines: saturation from
scraped metrics and from the router's own pending requests, 429 + Retry-After for sheddable,
critical never held, standard held and released late (the backend chosen at release)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from kvstack.errors import ConfigError
from kvstack.router.admission.base import ADMISSIONS
from kvstack.router.scheduling.plugins.base import PluginContext
from tests.router.conftest import RouterFactory, engines, until
from tests.router.fake_engine import FakeEngine

BODY = {"model": "toy", "prompt": "hello"}


def admission(**args: Any) -> dict[str, Any]:
    return {"admission": {"name": "priority", "args": args}, "policy": "least_load"}


async def post(
    http: aiohttp.ClientSession, url: str, priority: str | None = None, **body: Any
) -> tuple[int, dict[str, str], str]:
    headers = {"x-kvstack-priority": priority} if priority else {}
    async with http.post(f"{url}/v1/completions", json={**BODY, **body}, headers=headers) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.text()


async def test_saturated_fleet_sheds_sheddable_and_serves_critical(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    a, b = FakeEngine("a", waiting_requests=20), FakeEngine("b", waiting_requests=20)
    granted = {"default_max_priority": "critical"}  # callers without a key may ask for it here
    async with engines(a, b), run_router([a, b], **admission(retry_after_s=2), **granted) as r:
        await until(lambda: all(s.engine is not None for s in r.router.pool.states()))
        status, headers, text = await post(http, r.url, "sheddable")
        assert status == 429 and headers["retry-after"] == "2" and "waiting" in text
        status, _, _ = await post(http, r.url, "critical")
        assert status == 200
        status, _, text = await post(http, r.url, "urgent")
        assert status == 400 and "critical, standard, sheddable" in text
        a.waiting_requests = b.waiting_requests = 0
        await until(
            lambda: all((s.engine and s.engine.waiting) == 0 for s in r.router.pool.states())
        )
        status, _, _ = await post(http, r.url, "sheddable")
        assert status == 200


async def test_an_unknown_priority_is_refused_under_the_default_admission(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    a = FakeEngine("a")
    async with engines(a), run_router([a]) as r:
        await until(lambda: all(s.models for s in r.router.pool.states()))
        status, headers, text = await post(http, r.url, "urgent")
        assert status == 400 and "critical, standard, sheddable" in text
        assert headers["x-kvstack-error"] == "invalid_priority"
        status, _, _ = await post(http, r.url, "standard")
        assert status == 200


async def test_standard_waits_and_is_bound_late(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    slow = FakeEngine("slow", delay_s=0.5)
    fast = FakeEngine("fast")
    async with (
        engines(slow, fast),
        run_router(
            [slow, fast], **admission(saturation={"max_pending": 1, "max_waiting": None})
        ) as r,
    ):
        await until(lambda: all(s.engine is not None for s in r.router.pool.states()))
        fast.hang = True  # both backends busy: one request awaiting its first token each
        first = [asyncio.create_task(post(http, r.url)) for _ in range(2)]
        await until(lambda: slow.in_progress == 1 and fast.in_progress == 1)
        held = asyncio.create_task(post(http, r.url, "standard"))
        await asyncio.sleep(0.2)
        assert not held.done()  # held by admission: no backend chosen yet
        assert len(slow.seen) + len(fast.seen) == 2
        fast.hang = False
        status, headers, _ = await held  # slow freed its slot first: chosen at release
        assert status == 200 and headers["x-kvstack-backend"] == slow.url
        for task in first:
            task.cancel()
        await asyncio.gather(*first, return_exceptions=True)


async def test_queue_bounds_and_timeouts_shed(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a", waiting_requests=50)
    limits = {"standard": {"max_queued": 1, "timeout_s": 0.3}}
    async with engines(engine), run_router([engine], **admission(queues=limits)) as r:
        await until(lambda: all(s.engine is not None for s in r.router.pool.states()))
        held = asyncio.create_task(post(http, r.url, "standard"))
        await asyncio.sleep(0.05)
        status, _, text = await post(http, r.url, "standard")  # the queue holds one
        assert status == 429 and "waiting" in text
        status, _, text = await held
        assert status == 429 and "queue_timeout" in text


async def test_priority_from_model_and_tenant_config(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a", waiting_requests=50)
    queues = {"standard": {"max_queued": 0}}  # a lowered critical is shed at once
    args = admission(models={"toy": "sheddable"}, tenants={"gold": "critical"}, queues=queues)
    auth = {"auth": {"api_keys": [{"key": "k-gold", "tenant": "gold"}, {"key": "k-x"}]}}
    tenants = {"tenants": {"gold": {"max_priority": "critical"}}}
    async with engines(engine), run_router([engine], **args, **auth, **tenants) as r:
        await until(lambda: all(s.engine is not None for s in r.router.pool.states()))
        for key, expected in (("k-x", 429), ("k-gold", 429)):  # the model's priority wins
            headers = {"authorization": f"Bearer {key}"}
            async with http.post(f"{r.url}/v1/completions", json=BODY, headers=headers) as resp:
                assert resp.status == expected
        headers = {"authorization": "Bearer k-gold", "x-kvstack-priority": "critical"}
        async with http.post(f"{r.url}/v1/completions", json=BODY, headers=headers) as resp:
            assert resp.status == 200
        # A tenant without max_priority asking for critical is lowered to standard: shed.
        headers = {"authorization": "Bearer k-x", "x-kvstack-priority": "critical"}
        async with http.post(f"{r.url}/v1/completions", json=BODY, headers=headers) as resp:
            assert resp.status == 429


async def test_critical_from_a_caller_without_a_key_no_longer_skips_admission(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    """The finding: any client's ``x-kvstack-priority: critical`` skipped admission and
    shedding. By default it is lowered to standard, so a saturated fleet sheds it."""
    engine = FakeEngine("a", waiting_requests=20)
    queues = {"standard": {"max_queued": 0}}
    async with engines(engine), run_router([engine], **admission(queues=queues)) as r:
        await until(lambda: all(s.engine is not None for s in r.router.pool.states()))
        status, headers, _ = await post(http, r.url, "critical")
        assert status == 429 and "retry-after" in headers


def test_bad_admission_args_name_the_field() -> None:
    cls = ADMISSIONS.get("priority")
    with pytest.raises(ConfigError, match="queues"):
        cls(PluginContext(), queues={"critical": {"max_queued": 1}})
    with pytest.raises(ConfigError, match="default"):
        cls(PluginContext(), default="urgent")


def test_saturation_counts_stale_metrics_only_once_scraped() -> None:
    import time

    from kvstack.router.fleet.backends import Backend, BackendState
    from kvstack.router.fleet.engine_metrics import ScrapedMetrics
    from kvstack.router.fleet.saturation import FleetSaturation, SaturationLimits

    limits = SaturationLimits(max_pending=2, stale_saturates=True)
    never = BackendState(Backend("never", "http://never:1"))
    stale = BackendState(Backend("stale", "http://stale:1"), stale_after_s=1.0)
    stale.set_engine_metrics(ScrapedMetrics(time.monotonic() - 5, running=0, waiting=0))
    assert limits.reason(never) is None and limits.reason(stale) == "stale"
    never.load.acquire(10)
    assert limits.room(never) == 1
    never.load.acquire(10)
    assert limits.reason(never) == "pending"
    fleet = FleetSaturation(limits)
    assert fleet.room([never, stale]) == 0 and fleet.reason([never, stale]) in ("pending", "stale")
