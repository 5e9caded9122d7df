"""Tenants isolated on the real path: simulated engines (vLLM's block hashes, keyed by
``cache_salt`` as vLLM keys them, and vLLM's API key) behind the router, driven by the official
openai client.

The findings this holds fixed: tenants that sent no ``cache_salt`` shared one namespace, so
tenant B's copy of tenant A's prompt hit A's cached blocks; and every answer's
``x-kvstack-decision`` carried the chosen backend's match count for the prompt, an oracle of
whether another tenant's prompt was cached.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from pydantic import SecretStr

from kvstack.sim.config import SimConfig
from kvstack.sim.server import FleetThread, fleet_specs
from kvstack.stack.ports import free_port, free_port_run
from kvstack.stack.procs import ManagedProcess
from tests.router.conftest import RunningRouter, router_config, serve_router
from tests.router.scrape import metric_sum

ENGINE_KEY = "engine-key"
ADMIN_KEY = "admin-key"
TENANT_KEYS = {"a": "k-a", "b": "k-b", "docs-1": "k-d1", "docs-2": "k-d2"}
PROMPT = " ".join(f"t{i}" for i in range(100, 420))  # 320 tokens: 20 full blocks
PUBLIC_DECISION = re.compile(r"backend=[^;]+;reason=[a-z_]+")


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetThread]:
    config = SimConfig(block_size=16, num_blocks=1024, api_key=SecretStr(ENGINE_KEY))
    with FleetThread(fleet_specs(config, 2, free_port_run(2), "127.0.0.1")) as f:
        yield f


@pytest.fixture
async def router(fleet: FleetThread) -> AsyncIterator[RunningRouter]:
    config = router_config(
        fleet.urls,
        auth={
            "api_keys": [{"key": k, "tenant": t} for t, k in TENANT_KEYS.items()],
            "upstream_api_key": ENGINE_KEY,
            "admin_key": ADMIN_KEY,
        },
        tenants={"docs-1": {"kv_namespace": "docs"}, "docs-2": {"kv_namespace": "docs"}},
        prefix={"tokenizers": {"sim-model": "sim"}},
    )
    for engine in fleet.engines:
        engine.reset_prefix_cache()
    async with serve_router(config) as running:
        yield running


def _hits(fleet: FleetThread) -> float:
    """vLLM's prefix-cache hit tokens summed over the fleet (``/metrics`` is open, as vLLM's)."""
    return sum(metric_sum(url, "vllm:prefix_cache_hits_total") for url in fleet.urls)


async def _send(url: str, tenant: str, admin: bool = False, **body: object) -> httpx.Headers:
    headers = {"x-kvstack-admin-key": ADMIN_KEY} if admin else {}
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TENANT_KEYS[tenant], max_retries=0)
    try:
        raw = await client.completions.with_raw_response.create(
            model="sim-model", prompt=PROMPT, max_tokens=1, extra_headers=headers, extra_body=body
        )
    finally:
        await client.close()
    raw.parse()
    return raw.headers


def _assert_public(headers: httpx.Headers) -> None:
    """Backend and reason only: no match count, score, candidate count or other backend."""
    assert PUBLIC_DECISION.fullmatch(headers["x-kvstack-decision"]), headers["x-kvstack-decision"]
    for name, value in headers.items():
        if name.startswith("x-kvstack"):
            assert not re.search(r"prefix|score|candidates|gpu:|ttft=", value), (name, value)


async def test_tenant_b_gets_no_hit_on_tenant_a_prompt_and_no_match_count(
    fleet: FleetThread, router: RunningRouter
) -> None:
    await _send(router.url, "a")
    before = _hits(fleet)
    _assert_public(await _send(router.url, "a"))
    assert _hits(fleet) - before >= 304, "tenant A's own repeat must hit (the test can fail)"

    before = _hits(fleet)
    first_b = (await _send(router.url, "b", admin=True))["x-kvstack-decision"]
    assert _hits(fleet) == before, "tenant B's copy of A's prompt hit A's blocks"
    # The router's own index keys by the derived salt too: no routing credit crosses over.
    assert "prefix=none/" in first_b, first_b
    _assert_public(await _send(router.url, "b"))
    assert _hits(fleet) - before >= 304  # B's repeat hits B's own blocks
    full_a = (await _send(router.url, "a", admin=True))["x-kvstack-decision"]
    assert "candidates=2" in full_a and "prefix=" in full_a and "prefix=none/" not in full_a


async def test_tenants_sharing_a_namespace_share_kv_and_a_client_salt_stays_inside(
    fleet: FleetThread, router: RunningRouter
) -> None:
    await _send(router.url, "docs-1")
    before = _hits(fleet)
    await _send(router.url, "docs-2")
    assert _hits(fleet) - before >= 304, "tenants of one kv_namespace must share"
    before = _hits(fleet)
    await _send(router.url, "docs-2", cache_salt="private")
    assert _hits(fleet) == before, "a client salt is a namespace of its own within the tenant"


def test_engines_refuse_callers_without_the_engine_key(fleet: FleetThread) -> None:
    url = fleet.urls[0]
    with httpx.Client() as http:
        body = {"model": "sim-model", "prompt": "x", "max_tokens": 1}
        assert http.post(f"{url}/v1/completions", json=body).status_code == 401
        assert http.get(f"{url}/v1/models").status_code == 401
        auth = {"authorization": f"Bearer {ENGINE_KEY}"}
        assert http.get(f"{url}/v1/models", headers=auth).status_code == 200
        assert http.get(f"{url}/health").status_code == 200  # open, as vLLM's


def _router_process(fleet: FleetThread, tmp_path: Path, name: str, secret: Path | None) -> Any:
    """``kvstack router --config FILE``: the security section comes from the same file."""
    port = free_port()
    config: dict[str, Any] = {
        "router": {
            "host": "127.0.0.1",
            "port": port,
            "backends": [{"url": fleet.urls[0]}],
            "auth": {"api_keys": [{"key": "k-a", "tenant": "a"}], "upstream_api_key": ENGINE_KEY},
        }
    }
    if secret is not None:
        config["security"] = {"cluster_secret_file": str(secret)}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "kvstack", "router", "--config", str(path)]
    return ManagedProcess(name, argv, tmp_path / f"{name}.log").start(), f"http://127.0.0.1:{port}"


@pytest.mark.slow
async def test_routers_sharing_the_cluster_secret_derive_the_same_salts(
    fleet: FleetThread, tmp_path: Path
) -> None:
    """With the cluster secret, a tenant's salt is the same on every router (its KV survives
    a restart and is found through a second router); without one, each router has its own."""
    from kvstack.security import write_secret_file

    for engine in fleet.engines:
        engine.reset_prefix_cache()
    secret = write_secret_file(tmp_path / "cluster-secret")
    started = [_router_process(fleet, tmp_path, n, s)
               for n, s in (("r1", secret), ("r2", secret), ("r3", None))]  # fmt: skip
    try:
        for proc, url in started:  # started together: their imports overlap
            proc.wait_healthy(f"{url}/health", 60)
        (_, first), (_, second), (_, alone) = started
        await _send(first, "a")
        before = _hits(fleet)
        await _send(second, "a")
        assert _hits(fleet) - before >= 304, "another router with the secret: the same salt"
        before = _hits(fleet)
        await _send(alone, "a")
        assert _hits(fleet) == before, "a router without the secret must not derive it"
    finally:
        for proc, _ in started:
            proc.stop()
