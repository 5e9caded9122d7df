"""Model routes: aliases, weighted and sticky targets, 404 with the known names."""

from __future__ import annotations

import random

import pytest

from kvstack.errors import NoBackendError, UnknownModelError
from kvstack.router.config import ModelRoute
from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.scheduling.model_routes import ModelRouter


def _states(**models: list[str]) -> list[BackendState]:
    return [
        BackendState(Backend(n, f"http://{n}:1", static_models=frozenset(m)))
        for n, m in models.items()
    ]


def test_model_routes_resolve_and_list() -> None:
    routes = [
        ModelRoute.model_validate(
            {"name": "s", "targets": [{"model": "v1", "weight": 3}, {"model": "v2"}]}
        )
    ]
    router = ModelRouter(routes, {"alias": "s", "b": "base"}, random.Random(0))
    states = _states(a=["v1", "v2", "base"])
    picks = [router.resolve("s", states).target for _ in range(400)]
    assert 0.68 < picks.count("v1") / 400 < 0.82
    assert router.resolve("alias", states).route == "s"
    assert router.resolve("b", states) == ("base", None)
    assert len({router.resolve("s", states, session_key="u1").target for _ in range(20)}) == 1
    # A target no backend serves is skipped while another target is served.
    assert {router.resolve("s", _states(a=["v2"])).target for _ in range(20)} == {"v2"}
    with pytest.raises(UnknownModelError) as err:
        router.resolve("zzz", states)
    assert err.value.known == ["alias", "b", "base", "s", "v1", "v2"] and err.value.status == 404
    with pytest.raises(NoBackendError, match="reported its models"):
        router.resolve("zzz", _states(a=[]))
    assert [e["id"] for e in router.listed()] == ["s", "alias", "b"]
