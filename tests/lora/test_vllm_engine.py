"""A real vLLM CPU engine with runtime LoRA updating and real PEFT adapters made at test time:
load (verified, from the store), serve by ``adapter_id@version``, evict, publish a new version
while a request on the old one is in flight, roll back, reconcile against what the engine has."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kvstack.lora.config import AdapterEngineSpec, RequestClassBudget
from kvstack.lora.control import LoRAControl
from kvstack.lora.decision import Action
from kvstack.lora.driver import HTTPEngineDriver
from kvstack.lora.manager import AdapterCacheManager
from kvstack.lora.residency import ResidencyTier
from kvstack.lora.resolver import Resolver
from kvstack.lora.upkeep import reconcile, sync_releases
from kvstack.router.router import Router
from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec
from tests.lora.adapters import NO_VIOLATIONS, control_over, peft_adapter, real_plane
from tests.router.conftest import router_config, serve_router

pytestmark = pytest.mark.vllm
PROMPT = "the cache of the router and the adapter"


@pytest.fixture(scope="module")
def engine(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    spec = VLLMServerSpec(
        model=str(toy_model),
        port=free_port(),
        served_model_name="toy",
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=4,
        max_lora_rank=16,
    )
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(spec, log) as server:
        yield server


@pytest.fixture(scope="module")
def peft_sources(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("peft-sources")
    for name, seed in (("a-v1", 11), ("a-v2", 12), ("b-v1", 13), ("c-v1", 14)):
        peft_adapter(toy_model, root / name, seed=seed)
        (root / name / "README.md").unlink(missing_ok=True)
    return root


async def _complete(client: openai.AsyncOpenAI, model: str) -> tuple[str, str]:
    r = await client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    return r.model, r.choices[0].text


async def test_load_serve_evict_publish_in_flight_rollback(
    engine: VLLMServer,
    peft_sources: Path,
    keypair: tuple[Path, Path],
    toy_model: Path,
    tmp_path: Path,
) -> None:
    plane = real_plane(tmp_path, peft_sources, keypair, toy_model)
    for adapter_id, version, src in (
        ("a", "1", "a-v1"),
        ("a", "2", "a-v2"),
        ("b", "1", "b-v1"),
        ("c", "1", "c-v1"),
    ):
        plane.register(str(peft_sources / src), adapter_id, version, "toy", "acme", "gold", "test")
        plane.sign(adapter_id, version, keypair[0], "test")
    config = plane.config.model_copy(
        update={
            "engines": [
                AdapterEngineSpec(
                    url=engine.url,
                    base_model="toy",
                    served_model_name="toy",
                    warm_dir=str(tmp_path / "warm"),
                    gpu_slots=2,
                    host_slots=3,
                    max_lora_rank=16,
                )
            ]
        }
    )
    resolver = Resolver(plane.registry, config)
    resolver.refresh()
    driver = HTTPEngineDriver()
    m = AdapterCacheManager(config, resolver, plane.store, plane.verifier, plane.audit, driver)
    client = openai.AsyncOpenAI(base_url=f"{engine.url}/v1", api_key="unused")
    url = engine.url
    try:
        _, base_text = await _complete(client, "toy")

        # Load from the store (verified) and serve by adapter_id@version.
        d = await m.ensure_hot(url, resolver.resolve("a", "user-1"), budget_s=120)
        assert (d.action, d.model, d.start) == (Action.SERVE, "a@1", "cold")
        served, a1_text = await _complete(client, d.model)
        d.finish(ttft_s=0.1, served_model=served)
        assert served == "a@1" and a1_text != base_text
        loaded = await driver.adapters(url, 10)
        assert Path(loaded["a@1"]).parent == tmp_path / "warm"

        # Evict: two GPU slots; b and c push out the least recently used (a).
        for name in ("b", "c"):
            d = await m.ensure_hot(url, resolver.resolve(name), budget_s=120)
            d.finish(served_model=(await _complete(client, d.model))[0])
        assert set(await driver.adapters(url, 10)) == {"b@1", "c@1"}
        assert m.residency(url, "a@1") is ResidencyTier.WARM
        models = (await client.models.list()).data
        assert {c.id for c in models} == {"toy", "b@1", "c@1"}

        # Publish a@2 while a request on a@1 is in flight.
        old = await m.ensure_hot(url, resolver.resolve("a"), budget_s=120)
        assert (old.model, old.start) == ("a@1", "warm")
        stream = await client.completions.create(
            model=old.model,
            prompt=PROMPT,
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = [await stream.__anext__()]
        plane.promote("a", "2", "test")
        resolver.refresh()
        assert sync_releases(m) == [(url, "a@2")]  # loads beside the old version
        new = await m.ensure_hot(url, resolver.resolve("a"), budget_s=120)
        assert new.model == "a@2"
        served, a2_text = await _complete(client, new.model)
        new.finish(served_model=served)
        assert served == "a@2" and a2_text not in (a1_text, base_text)
        assert {"a@1", "a@2"} <= set(await driver.adapters(url, 10))
        chunks += [c async for c in stream]
        assert {c.model for c in chunks} == {"a@1"}  # the in-flight request kept its version
        streamed = "".join(c.choices[0].text for c in chunks)
        assert streamed.startswith(a1_text)
        old.finish(served_model="a@1")
        await _wait_unloaded(driver, url, "a@1")  # retired once unused

        # Roll back in one command: a@1 comes back from the warm tier, same weights as before.
        plane.rollback("a", "test")
        resolver.refresh()
        back = await m.ensure_hot(url, resolver.resolve("a"), budget_s=120)
        assert (back.model, back.start) == ("a@1", "warm")
        served, text = await _complete(client, back.model)
        back.finish(served_model=served)
        assert (served, text) == ("a@1", a1_text)

        # Reconcile: an adapter loaded behind the manager's back is unloaded.
        async with httpx.AsyncClient() as http:
            r = await http.post(
                f"{url}/v1/load_lora_adapter",
                json={"lora_name": "rogue", "lora_path": str(peft_sources / "c-v1")},
            )
            assert r.status_code == 200
        report = await reconcile(m, m.engine(url))
        assert report.unloaded == ["rogue"] and "rogue" not in await driver.adapters(url, 10)
        assert m.metrics.invariants == NO_VIOLATIONS
        loads = [e for e in plane.audit.entries(action="load", limit=100) if e.decision == "accept"]
        assert len(loads) >= 5 and all(e.digest for e in loads)
    finally:
        await m.aclose()
        await driver.aclose()
        await client.close()


async def _wait_unloaded(driver: HTTPEngineDriver, url: str, name: str) -> None:
    for _ in range(200):
        loaded = await driver.adapters(url, 10)
        if name not in loaded:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} still loaded after 10 s: {sorted(loaded)}")


async def test_router_resolves_and_loads_adapters_on_a_real_engine(
    engine: VLLMServer,
    peft_sources: Path,
    keypair: tuple[Path, Path],
    toy_model: Path,
    tmp_path: Path,
) -> None:
    """The whole request path: the official client asks the router for ``routed``; the registry
    resolves it, the manager verifies and loads it into vLLM, the answer is the adapter's."""
    plane = real_plane(tmp_path, peft_sources, keypair, toy_model)
    plane.register(str(peft_sources / "b-v1"), "routed", "1", "toy", "acme", "gold", "test")
    plane.sign("routed", "1", keypair[0], "test")
    spec = AdapterEngineSpec(
        url=engine.url,
        base_model="toy",
        served_model_name="toy",
        warm_dir=str(tmp_path / "warm"),
        gpu_slots=2,
        host_slots=3,
    )
    classes = {"interactive": RequestClassBudget(cold_start_budget_s=None)}  # wait for loads
    control = control_over(plane, engines=[spec], request_classes=classes)
    router_cfg = router_config([engine.url], adapters={"enabled": True}, timeouts={"total_s": 300})
    async with serve_router(router_cfg, Router(router_cfg, lora=control)) as running:
        await _through_router(f"{running.url}/v1", engine, control)


async def _through_router(url: str, engine: VLLMServer, control: LoRAControl) -> None:
    via_router = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    direct = openai.AsyncOpenAI(base_url=f"{engine.url}/v1", api_key="unused")
    try:
        listed = {m.id for m in (await via_router.models.list()).data}
        assert {"toy", "routed"} <= listed
        served, text = await _complete(via_router, "routed")
        assert served == "routed@1"
        assert control.manager.residency(engine.url, "routed@1") is ResidencyTier.HOT
        assert (await _complete(direct, "routed@1")) == (served, text)
        assert (await _complete(direct, "toy"))[1] != text
        stream = await via_router.completions.create(
            model="routed", prompt=PROMPT, max_tokens=8, temperature=0, stream=True
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks) == text
        assert {c.model for c in chunks} == {"routed@1"}
        assert control.manager.metrics.invariants == NO_VIOLATIONS
    finally:
        await via_router.close()
        await direct.close()
