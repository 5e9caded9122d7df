"""Kubernetes discovery with the official client against a fake API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import aiohttp

from kvstack.router.config import KubernetesConfig
from kvstack.router.fleet.backends import Backend
from kvstack.router.fleet.discovery.kubernetes import KubernetesDiscovery
from tests.router.conftest import RouterFactory, engines
from tests.router.fake_engine import FakeEngine
from tests.router.fake_kube import FakeKube, pod


def discovery(kube: FakeKube, **overrides: object) -> KubernetesDiscovery:
    config = {
        "api_url": kube.url,
        "namespace": "llm",
        "label_selector": "app=vllm",
        "port": 8000,
        "watch_timeout_s": 1,
        "relist_interval_s": 30.0,
        **overrides,
    }
    return KubernetesDiscovery(KubernetesConfig.model_validate(config))


class Snapshots:
    def __init__(self) -> None:
        self.last: list[Backend] = []

    def __call__(self, backends: Sequence[Backend]) -> None:
        self.last = list(backends)

    @property
    def ids(self) -> list[str]:
        return [b.id for b in self.last]


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_list_then_watch_follows_readiness_deletion_and_ips() -> None:
    async with FakeKube().running() as kube:
        await kube.put(pod("a", ip="10.0.0.1"))
        await kube.put(pod("starting", ready=False))
        await kube.put(pod("no-ip", ip=""))
        await kube.put(pod("other", labels={"app": "web"}))
        await kube.put(pod("v6", ip="fd00::1"))
        seen = Snapshots()
        source = discovery(kube)
        await source.start(seen)
        try:
            await until(lambda: seen.ids == ["llm/a", "llm/v6"])  # published before start returned
            assert seen.last[0].url == "http://10.0.0.1:8000"
            assert seen.last[1].url == "http://[fd00::1]:8000"
            await kube.put(pod("starting"))  # became Ready
            await until(lambda: seen.ids == ["llm/a", "llm/starting", "llm/v6"])
            await kube.put(pod("a", ip="10.0.0.1", deleting=True))  # terminating
            await until(lambda: seen.ids == ["llm/starting", "llm/v6"])
            await kube.delete("v6")
            await until(lambda: seen.ids == ["llm/starting"])
            await kube.put(pod("b", labels={"app": "vllm", "kvstack.io/role": "prefill"}))
            await until(lambda: "llm/b" in seen.ids)
            assert next(b for b in seen.last if b.id == "llm/b").role == "prefill"
        finally:
            await source.close()


async def test_periodic_relist_repairs_a_missed_deletion() -> None:
    async with FakeKube().running() as kube:
        await kube.put(pod("a"))
        await kube.put(pod("ghost"))
        seen = Snapshots()
        source = discovery(kube, relist_interval_s=1.0)
        await source.start(seen)
        try:
            await until(lambda: seen.ids == ["llm/a", "llm/ghost"])
            await kube.delete("ghost", silent=True)  # the watch never hears of it
            await until(lambda: seen.ids == ["llm/a"], timeout_s=4)
            assert kube.num_lists >= 2
        finally:
            await source.close()


async def test_gone_resource_version_triggers_a_relist() -> None:
    async with FakeKube().running() as kube:
        await kube.put(pod("a"))
        seen = Snapshots()
        source = discovery(kube)
        await source.start(seen)
        try:
            await until(lambda: seen.ids == ["llm/a"])
            lists = kube.num_lists
            await kube.put(pod("b"), silent=True)
            kube.compact()  # the watcher's version is now too old: 410 at its next watch
            await until(lambda: seen.ids == ["llm/a", "llm/b"], timeout_s=4)
            assert kube.num_lists > lists
        finally:
            await source.close()


async def test_router_routes_to_discovered_pods(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a")
    async with engines(engine), FakeKube().running() as kube:
        await kube.put(pod("engine-0"))
        k8s = {"api_url": kube.url, "namespace": "llm", "port": engine.port, "watch_timeout_s": 1}
        async with run_router([], discovery={"kind": "kubernetes", "kubernetes": k8s}) as r:
            async with http.post(
                f"{r.url}/v1/completions", json={"model": "toy", "prompt": "x"}
            ) as resp:
                assert resp.status == 200 and resp.headers["x-kvstack-backend"] == "llm/engine-0"
            await kube.put(pod("engine-0", ready=False))
            await until(lambda: len(r.router.pool) == 0)
            async with http.get(f"{r.url}/health") as resp:
                assert resp.status == 503
