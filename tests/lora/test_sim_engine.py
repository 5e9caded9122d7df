"""The manager driving simulated engines (kvstack's vLLM-compatible simulator with LoRA slots)
over HTTP: the same driver and endpoints as vLLM, cheap enough for two engines."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai

from kvstack.lora.decision import Action
from kvstack.lora.driver import HTTPEngineDriver
from kvstack.lora.residency import ResidencyTier
from kvstack.lora.upkeep import reconcile
from kvstack.sim.server import FleetThread
from tests.lora.adapters import NO_VIOLATIONS
from tests.lora.conftest import Setup


async def test_manager_over_simulated_engines(
    make_setup: Callable[..., Setup], fleet: FleetThread
) -> None:
    s = make_setup(gpu_slots=2, host_slots=3, num_engines=2)
    for spec, url in zip(s.manager.config.engines, fleet.urls, strict=True):
        s.manager.remove_engine(spec.url)
        s.manager.add_engine(spec.model_copy(update={"url": url}))
    driver = HTTPEngineDriver()
    s.manager.driver = s.manager.loader.driver = driver
    adapters = [s.add(f"t{i}", seed=i) for i in range(3)]
    url = fleet.urls[0]
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
    try:
        for a in adapters:
            s.clock.now += 1
            d = await s.manager.ensure_hot(url, a, budget_s=60)
            assert (d.action, d.start) == (Action.SERVE, "cold")
            r = await client.completions.create(model=d.model, prompt="hello there", max_tokens=4)
            d.finish(ttft_s=0.01, served_model=r.model)
        served = {m.id for m in (await client.models.list()).data}
        assert served == {"toy-base", "t1@1", "t2@1"}  # t0 was unloaded for the third
        assert s.manager.residency(url, "t0@1") is ResidencyTier.WARM
        info = await driver.lora_info(url, 5)
        assert info is not None and info.max_lora == 2
        async with httpx.AsyncClient() as http:  # the engine forgets t1 behind our back
            await http.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "t1@1"})
        report = await reconcile(s.manager, s.manager.engine(url))
        assert (
            report.lost_hot == ["t1@1"] and s.manager.residency(url, "t1@1") is ResidencyTier.WARM
        )
        other = fleet.urls[1]
        d = await s.manager.ensure_hot(other, adapters[0], budget_s=60)  # per-engine residency
        assert (d.action, d.start) == (Action.SERVE, "cold")
        d.finish()
        assert s.manager.metrics.invariants == NO_VIOLATIONS
    finally:
        await client.close()
        await s.manager.aclose()
        await driver.aclose()
