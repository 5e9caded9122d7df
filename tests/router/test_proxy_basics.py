"""The gateway end to end in one process: real sockets, a live router, fake engines."""

from __future__ import annotations

import aiohttp

from tests.router.conftest import RouterFactory, engines
from tests.router.fake_engine import FakeEngine


async def test_completion_is_forwarded_with_unknown_fields_and_explained(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    async with engines(FakeEngine("a")) as (a,), run_router([a]) as r:
        body = {"model": "toy", "prompt": "hi", "max_tokens": 3, "my_vendor_field": {"x": [1, 2]}}
        async with http.post(f"{r.url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            data = await resp.json()
            assert data["choices"][0]["text"] == "from a"
            assert resp.headers["x-kvstack-backend"] == a.url
            assert "reason=only_candidate" in resp.headers["x-kvstack-decision"]
        assert a.seen[-1].body == body  # forwarded unchanged
        assert a.seen[-1].headers["x-request-id"] == resp.headers["x-request-id"]
