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
    assert [e["id"] for e in router.listed(states)] == ["s", "alias", "b"]


def _canary_router(registered: set[str] | None = None) -> ModelRouter:
    routes = [
        ModelRoute.model_validate(
            {"name": "support", "targets": [{"model": "support-v1"}, {"model": "support-v2"}]}
        ),
        ModelRoute.model_validate({"name": "s", "targets": [{"model": "v1"}, {"model": "v2"}]}),
    ]
    aliases = {"help": "support", "old": "gone", "fast": "v1"}
    known = None if registered is None else registered.__contains__
    return ModelRouter(routes, aliases, random.Random(0), known)


def test_a_route_or_alias_with_nothing_served_is_not_listed_and_is_named() -> None:
    router = _canary_router()
    states = _states(a=["v1"], b=["base"])
    assert [e["id"] for e in router.listed(states)] == ["s", "fast"]
    assert router.listed(states)[0]["root"] == "v1"  # the served target, not the first one
    assert router.unserved(states) == [
        ("support", "support-v1", False),
        ("support", "support-v2", False),
        ("s", "v2", True),  # v1 still takes the route's requests
        ("old", "gone", False),
    ]
    # A backend reporting a target later: the same router lists the route at once.
    later = _states(a=["v1", "v2"], b=["support-v2"])
    assert [e["id"] for e in router.listed(later)] == ["support", "s", "help", "fast"]
    assert router.unserved(later) == [("support", "support-v1", True), ("old", "gone", False)]


def test_a_target_the_adapter_registry_knows_counts_as_servable() -> None:
    router = _canary_router(registered={"support-v1"})
    states = _states(a=["v1", "v2"])
    assert [e["id"] for e in router.listed(states)] == ["support", "s", "help", "fast"]
    assert router.unserved(states) == [
        ("support", "support-v2", True),
        ("old", "gone", False),
    ]
