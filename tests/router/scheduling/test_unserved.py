"""Unserved model targets: one log line each at start, changes only after, on a live router."""

from __future__ import annotations

import logging
import random

import aiohttp
import pytest

from kvstack.router.config import ModelRoute
from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.scheduling.model_routes import ModelRouter
from kvstack.router.scheduling.unserved import UnservedTargets
from tests.router.conftest import RouterFactory, engines, until
from tests.router.fake_engine import FakeEngine

CANARY = {
    "name": "support",
    "targets": [{"model": "support-v1", "weight": 90}, {"model": "support-v2", "weight": 10}],
}


def _states(*models: list[str]) -> list[BackendState]:
    return [
        BackendState(Backend(f"e{i}", f"http://e{i}:1", static_models=frozenset(m)))
        for i, m in enumerate(models)
    ]


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [r.getMessage() for r in caplog.records]
    caplog.clear()
    return messages


def test_each_unserved_target_is_logged_once_and_its_return_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kvstack.router.scheduling.unserved")
    routes = [ModelRoute.model_validate(CANARY)]
    check = UnservedTargets(ModelRouter(routes, {}, random.Random(0))).check
    assert check(_states([])) == []
    assert _messages(caplog) == [
        "model targets cannot be checked yet: no backend has reported its models"
    ]
    check(_states(["llama"]))
    assert _messages(caplog) == [
        f"model route 'support': target {t!r} is served by no backend (they serve: llama); "
        "requests for 'support' fail and it is not in /v1/models until a backend serves it"
        for t in ("support-v1", "support-v2")
    ]
    check(_states(["llama"]))
    assert _messages(caplog) == []  # not repeated every health round
    assert check(_states(["llama", "support-v2"])) == [("support", "support-v1", True)]
    assert _messages(caplog) == ["model route 'support': target 'support-v2' is served now"]
    UnservedTargets(ModelRouter(routes, {}, random.Random(0))).check(_states(["support-v2"]))
    assert _messages(caplog) == [
        "model route 'support': target 'support-v1' is served by no backend (they serve: "
        "support-v2); its share goes to the route's other targets until a backend serves it"
    ]


async def test_router_warns_at_start_and_lists_the_route_once_a_backend_reports_it(
    run_router: RouterFactory, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "kvstack.router.scheduling.unserved")
    async with (
        engines(FakeEngine("a", models=["llama"])) as (a,),
        run_router([a], models=[CANARY]) as r,
    ):
        warned = [m for m in _messages(caplog) if "is served by no backend" in m]
        assert [m.split(":")[1] for m in warned] == [
            " target 'support-v1' is served by no backend (they serve",
            " target 'support-v2' is served by no backend (they serve",
        ]
        async with http.get(f"{r.url}/v1/models") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["llama"]
        body = {"model": "support", "prompt": "hi", "max_tokens": 1}
        async with http.post(f"{r.url}/v1/completions", json=body) as resp:
            assert resp.status == 503  # "fail", as the warning says
        a.models.append("support-v2")  # the engine now serves the canary

        async def listed() -> list[str]:
            async with http.get(f"{r.url}/v1/models") as resp:
                return [m["id"] for m in (await resp.json())["data"]]

        await until(lambda: "support-v2" in r.router.pool.states()[0].models)
        assert await listed() == ["llama", "support-v2", "support"]
