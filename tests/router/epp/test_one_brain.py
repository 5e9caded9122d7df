"""One brain: the same request sequence through the router (HTTP proxy) and through the EPP
(ext_proc, the data plane played by the Envoy double), each from a fresh start on the same
fleet, gets the same picks and the same decision reasons."""

from __future__ import annotations

import httpx

from tests.router.conftest import engines, router_config, serve_router
from tests.router.epp.conftest import serve_epp
from tests.router.fake_engine import FakeEngine

PATH = "/v1/completions"
ROUTE = {"name": "toy", "targets": [{"model": "toy-a", "weight": 3}, {"model": "toy-b"}]}


def sequence() -> list[tuple[dict[str, object], dict[str, str]]]:
    """Shared prefixes, repeats, a weighted route and sessions, in one fixed order."""
    out = []
    for i in range(24):
        prefix = ("system one " * 90, "system two " * 90, "system three " * 90)[i % 3]
        body = {"model": "toy", "prompt": f"{prefix} question {i // 3}", "max_tokens": 3}
        out.append((body, {"x-session-id": f"user-{i % 5}"}))
    return out


def decision(headers: httpx.Headers | dict[str, str]) -> tuple[str, str]:
    backend = headers["x-kvstack-backend"]
    reason = headers["x-kvstack-decision"].split(";")[0]
    return backend, reason


async def test_router_and_epp_make_the_same_picks() -> None:
    fleet = [
        FakeEngine("a", models=["toy-a", "toy-b"]),
        FakeEngine("b", models=["toy-a", "toy-b"]),
        FakeEngine("c", models=["toy-a"]),
    ]
    options = {"models": [ROUTE], "policy": "ttft"}
    async with engines(*fleet) as started, httpx.AsyncClient(timeout=10) as http:
        via_router = []
        async with serve_router(router_config(started, **options)) as router:
            for body, headers in sequence():
                answer = await http.post(f"{router.url}{PATH}", json=body, headers=headers)
                assert answer.status_code == 200, answer.text
                via_router.append((*decision(answer.headers), answer.json()["model"]))
        via_epp = []
        async with serve_epp(started, **options) as epp:
            for body, headers in sequence():
                done = await epp.envoy.forward(PATH, body, http, headers=headers)
                assert done.status == 200, done.body
                assert _backend_of(epp, done.answer.endpoint) == done.headers["x-kvstack-backend"]
                via_epp.append((*decision(done.headers), done.answer.json["model"]))
        assert via_epp == via_router
        picks = [(b, m) for b, _, m in via_router]
        assert len({b for b, _ in picks}) == 3 and {m for _, m in picks} == {"toy-a", "toy-b"}
        assert {reason for _, reason, _ in via_router} - {"reason=only_candidate"}


def _backend_of(epp: object, endpoint: str | None) -> str:
    for state in epp.server.router.pool.states():  # type: ignore[attr-defined]
        if state.url.endswith(f"//{endpoint}"):
            return str(state.id)
    raise AssertionError(f"{endpoint} is not a backend")
