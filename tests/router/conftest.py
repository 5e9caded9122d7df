"""Router test fixtures: the router served by uvicorn in the test's event loop, on a free port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import aiohttp
import pytest

from kvstack.router.config import RouterConfig
from kvstack.router.http.server import build_server
from kvstack.router.router import Router
from kvstack.section import deep_merge
from kvstack.stack.ports import free_port
from tests.router.fake_engine import FakeEngine

# Fast loops so that tests see health and metric changes within a fraction of a second.
FAST = {
    "host": "127.0.0.1",
    # A generous check timeout: a busy host must not fail the first check of a live engine.
    "health": {"interval_s": 0.1, "timeout_s": 2.0, "models_interval_s": 0.2},
    "scrape": {"interval_s": 0.05, "stale_after_s": 1.0},
    "retry": {"backoff_base_s": 0.001, "backoff_max_s": 0.01},
    "seed": 7,
}


def router_config(backends: Iterable[FakeEngine | str], **overrides: Any) -> RouterConfig:
    urls = [b if isinstance(b, str) else b.url for b in backends]
    data = deep_merge(FAST, {"port": free_port(), "backends": [{"url": u} for u in urls]})
    return RouterConfig.model_validate(deep_merge(data, overrides))


class RunningRouter:
    def __init__(self, router: Router, url: str) -> None:
        self.router = router
        self.url = url


@asynccontextmanager
async def serve_router(
    config: RouterConfig, router: Router | None = None
) -> AsyncIterator[RunningRouter]:
    """Serve ``router`` (default: one built from ``config``) until the block ends."""
    router = router or Router(config)
    server = build_server(config, router)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("router exited during startup")
        await asyncio.sleep(0.01)
    try:
        yield RunningRouter(router, f"http://127.0.0.1:{config.port}")
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


RouterFactory = Callable[..., AbstractAsyncContextManager[RunningRouter]]


@pytest.fixture
def run_router() -> RouterFactory:
    """``async with run_router(engines, **overrides) as r:`` — a live router in this loop."""

    def start(backends: Iterable[FakeEngine | str], **overrides: Any) -> Any:
        return serve_router(router_config(backends, **overrides))

    return start


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` until it holds (AssertionError after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def engines(*specs: FakeEngine) -> AsyncIterator[list[FakeEngine]]:
    started = [await e.start() for e in specs]
    try:
        yield started
    finally:
        for e in started:
            await e.stop()
