"""The admin API on a real uvicorn server on loopback: auth, register, canary (prewarmed
before traffic), promote, rollback, disable, engines, audit, TTFT."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import uvicorn

from kvstack.lora.admin import create_admin_app
from kvstack.lora.residency import ResidencyTier
from kvstack.stack.ports import free_port
from tests.lora.adapters import synthetic_adapter
from tests.lora.conftest import Setup

KEY = "s3cret-admin-key"
URL = "http://engine-a"


@pytest.fixture
async def admin(make_setup: Callable[..., Setup]) -> AsyncIterator[tuple[httpx.AsyncClient, Setup]]:
    s = make_setup(gpu_slots=2, host_slots=4)
    port = free_port()
    app = create_admin_app(s.plane, s.manager, KEY)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    for _ in range(1000):
        if server.started:
            break
        await asyncio.sleep(0.01)
    headers = {"authorization": f"Bearer {KEY}", "x-actor": "ops-alice"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
        yield client, s
    server.should_exit = True
    await task
    await s.manager.aclose()


async def test_admin_release_cycle(admin: tuple[httpx.AsyncClient, Setup]) -> None:
    client, s = admin
    for bad in ({}, {"authorization": "Bearer wrong"}):
        r = await httpx.AsyncClient(base_url=str(client.base_url)).get("/adapters", headers=bad)
        assert r.status_code == 401
    src = synthetic_adapter(s.sources / "v1")
    body = {
        "source": str(src),
        "adapter_id": "acme-support",
        "version": "v1",
        "base_model": "toy",
        "tenant_id": "acme",
        "priority_tier": "gold",
    }
    r = await client.post("/adapters", json=body)
    assert r.status_code == 201 and r.json()["status"] == "active"
    s.plane.sign("acme-support", "v1", _key(s), actor="test")
    r = await client.post("/adapters", json={**body, "source": "/etc"})
    assert (r.status_code, r.json()["error"]["code"]) == (422, "source_not_allowed")
    s.add("acme-support", "v2", seed=3, activate=False)

    r = await client.post("/adapters/acme-support/canary", json={"version": "v2", "percent": 20})
    assert r.status_code == 200, r.text
    assert r.json()["prewarmed"] == {URL: "ok"} and r.json()["canary_percent"] == 20
    assert s.manager.residency(URL, "acme-support@v2") is ResidencyTier.HOT  # before any traffic
    r = await client.post("/adapters/acme-support/promote", json={"version": "v2"})
    assert (r.json()["stable_version"], r.json()["rollback_to"]) == ("v2", "v1")
    assert s.manager.resolver.resolve("acme-support").engine_name == "acme-support@v2"
    r = await client.post("/adapters/acme-support/rollback")
    assert r.json()["stable_version"] == "v1"
    assert s.manager.resolver.resolve("acme-support").engine_name == "acme-support@v1"
    r = await client.post("/adapters/acme-support/disable", json={"version": "v9"})
    assert r.status_code == 404
    r = await client.post("/adapters/acme-support/canary", json={"version": "v2", "percent": "x"})
    assert r.status_code == 400 and "percent" in r.json()["error"]["message"]

    r = await client.post("/adapters/acme-support/prewarm", json={})
    assert r.json() == {"adapter": "acme-support@v1", "engines": {URL: "ok"}}
    (await s.manager.ensure_hot(URL, s.manager.resolver.resolve("acme-support"))).finish(
        ttft_s=0.25
    )
    engines = (await client.get("/engines")).json()["engines"]
    assert "acme-support@v1" in engines[0]["hot"]
    assert (await client.get("/ttft", params={"adapter": "acme-support"})).json()["count"] == 1
    shown = (await client.get("/adapters/acme-support")).json()
    assert [v["status"] for v in shown["versions"]] == ["active", "staged"]
    audit = (await client.get("/audit", params={"adapter_id": "acme-support"})).json()["entries"]
    actions = {(e["action"], e["actor"]) for e in audit}
    assert {
        ("canary", "admin-api:ops-alice"),
        ("rollback", "admin-api:ops-alice"),
        ("load", "manager"),
    } <= actions


def _key(s: Setup) -> Path:
    return Path(s.plane.config.trusted_keys[0]).with_name("signer.pem")
