"""Two tenants isolated through kvstack's tiers, on the real path: the router (API keys for two
tenants, neither sending a ``cache_salt``) in front of a real vLLM CPU engine with the kvstack
connector (cpu and file tiers) and vLLM's API key, driven by the official openai client.

The finding: tenants that sent no ``cache_salt`` shared one namespace, so the second tenant's
identical prompt loaded the first tenant's chunks. Now the router derives each tenant's salt,
the connector keys its chunks by it, and the second tenant loads nothing the first stored;
neither sees a match count. vLLM's own prefix cache is off, so every repeat goes through the
connector's tiers (a hit is counted in ``kvstack_connector_hit_tokens_total``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kvstack.stack.vllm_server import VLLMServer, connector_config
from tests.e2e.engines import metric_total, start_engine, wait_metric
from tests.router.conftest import router_config, serve_router

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HITS = "kvstack_connector_hit_tokens_total"
ENGINE_KEY = "engine-key-for-the-router-only"
KEYS = {"alpha": "k-alpha", "beta": "k-beta"}
TOKENS = [random.Random(7).randrange(10, 2000) for _ in range(1024)]
HIT = 896  # (1024 - 1) // 128 * 128: vLLM loads whole blocks and computes the last token


@pytest.fixture(scope="module")
def engine(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    workdir = tmp_path_factory.mktemp("tenants")
    tiers = ["cpu://?size=256MiB", f"file://{workdir / 'kv'}?size=1GiB"]
    server = start_engine(
        toy_model,
        workdir,
        "tenants",
        kv_transfer_config=connector_config(tiers, chunk_size=256),
        extra_args=["--no-enable-prefix-caching"],
        env={"VLLM_API_KEY": ENGINE_KEY},
    )
    yield server
    server.stop()


async def _ask(url: str, tenant: str) -> tuple[list[int], httpx.Headers]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEYS[tenant], max_retries=0)
    try:
        raw = await client.completions.with_raw_response.create(
            model="toy",
            prompt=TOKENS,
            max_tokens=4,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
    finally:
        await client.close()
    answer = raw.parse()
    return list(answer.choices[0].token_ids or []), raw.headers  # type: ignore[attr-defined]


def _public(headers: httpx.Headers) -> bool:
    decision = headers["x-kvstack-decision"]
    return decision.startswith("backend=") and "prefix" not in decision and "score" not in decision


async def test_the_second_tenant_loads_none_of_the_first_tenants_chunks(
    engine: VLLMServer,
) -> None:
    config = router_config(
        [engine.url],
        auth={
            "api_keys": [{"key": k, "tenant": t} for t, k in KEYS.items()],
            "upstream_api_key": ENGINE_KEY,
        },
        health={"interval_s": 0.5, "timeout_s": 10.0},
    )
    async with serve_router(config) as router:
        hits = metric_total(engine, HITS)
        alpha_cold, headers = await _ask(router.url, "alpha")
        assert _public(headers)
        assert wait_metric(engine, HITS, hits + 1, timeout_s=1.0) == hits  # nothing stored yet
        alpha_warm, _ = await _ask(router.url, "alpha")
        assert wait_metric(engine, HITS, hits + HIT) == hits + HIT, "alpha's repeat must hit"

        beta_cold, headers = await _ask(router.url, "beta")
        assert _public(headers)
        after = wait_metric(engine, HITS, hits + HIT + 1, timeout_s=2.0)
        assert after == hits + HIT, "beta's copy of alpha's prompt loaded alpha's chunks"
        assert beta_cold == alpha_cold  # the same cold computation, in its own namespace
        await _ask(router.url, "beta")
        assert wait_metric(engine, HITS, hits + 2 * HIT) == hits + 2 * HIT  # beta's own hit
    assert alpha_warm == alpha_cold


def test_the_engine_answers_only_the_key_holder(engine: VLLMServer) -> None:
    """vLLM's own guard: with ``VLLM_API_KEY`` only the router (its upstream key) gets in."""
    body = {"model": "toy", "prompt": "x", "max_tokens": 1}
    assert httpx.post(f"{engine.url}/v1/completions", json=body).status_code == 401
    assert httpx.get(f"{engine.url}/v1/models").status_code == 401
    auth = {"authorization": f"Bearer {ENGINE_KEY}"}
    assert httpx.get(f"{engine.url}/v1/models", headers=auth).status_code == 200
