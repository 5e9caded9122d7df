"""The router with the adapter control plane in front of simulated engines with LoRA slots:
names resolve through the registry, adapters load under budgets, affinity keeps an adapter on
the engine where it is hot, canary and rollback take effect, tenants see only their adapters,
and the admin API is served under the router's admin path."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import SecretStr

from kvstack.errors import LoRAError, RequestError
from kvstack.lora.config import AdapterEngineSpec, RequestClassBudget, TenantPolicy
from kvstack.lora.control import LoRAControl
from kvstack.lora.plane import ControlPlane
from kvstack.lora.residency import ResidencyTier
from kvstack.router.adapters import AdapterStage, served_model
from kvstack.router.config import AdaptersConfig
from kvstack.router.http.parse import parse_request
from kvstack.router.router import Router
from kvstack.router.scheduling.prompts import PromptRenderer
from kvstack.sim.server import FleetThread
from tests.lora.adapters import NO_VIOLATIONS, control_over, synthetic_adapter
from tests.router.conftest import router_config, serve_router

ADMIN_KEY = "admin-secret"


def _register(
    plane: ControlPlane,
    sources: Path,
    keypair: tuple[Path, Path],
    adapter_id: str,
    version: str = "1",
    tenant: str = "acme",
    tier: str = "gold",
    seed: int = 0,
) -> None:
    src = synthetic_adapter(sources / f"{adapter_id}-{version}", seed=seed)
    plane.register(str(src), adapter_id, version, "toy", tenant, tier, actor="test")
    plane.sign(adapter_id, version, keypair[0], actor="test")


def _control(
    plane: ControlPlane, fleet: FleetThread, tmp_path: Path, **update: object
) -> LoRAControl:
    engines = [
        AdapterEngineSpec(
            url=url + "/",  # a trailing slash must not stop the router matching its backend
            base_model="toy",
            served_model_name="toy-base",
            warm_dir=str(tmp_path / f"warm-{i}"),
            gpu_slots=2,
            host_slots=4,
        )
        for i, url in enumerate(fleet.urls)
    ]
    tenants = {
        "acme": TenantPolicy(allow_base_fallback=True),
        "strict": TenantPolicy(allow_base_fallback=False),
    }
    return control_over(
        plane,
        **{"engines": engines, "tenants": tenants, "admin_key": SecretStr(ADMIN_KEY), **update},
    )


async def test_requests_resolve_load_and_stay_where_the_adapter_is_hot(
    plane: ControlPlane,
    sources: Path,
    keypair: tuple[Path, Path],
    fleet: FleetThread,
    tmp_path: Path,
) -> None:
    for i, name in enumerate(("support", "sales")):
        _register(plane, sources, keypair, name, seed=i)
    # Loads on the simulator take 20 ms: predicted so, they fit the interactive budget.
    control = _control(plane, fleet, tmp_path, load_time_prior_s={"warm": 0.05, "cold": 0.2})
    config = router_config(fleet.urls, adapters={"enabled": True})
    async with serve_router(config, Router(config, lora=control)) as running:
        await _resolve_load_affinity_canary(running.url, control, fleet, plane, sources, keypair)


async def _resolve_load_affinity_canary(
    url: str,
    control: LoRAControl,
    fleet: FleetThread,
    plane: ControlPlane,
    sources: Path,
    keypair: tuple[Path, Path],
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    try:
        backends = set()
        for _ in range(4):
            raw = await client.completions.with_raw_response.create(
                model="support", prompt="hello there", max_tokens=4
            )
            assert raw.parse().model == "support@1"
            assert "x-kvstack-adapter-fallback" not in raw.headers
            backends.add(raw.headers["x-kvstack-backend"])
        assert len(backends) == 1, f"an adapter hot on one engine moved: {backends}"
        home = next(iter(backends))
        engine_url = next(u for u in fleet.urls if u in home or home in u)
        assert control.manager.residency(engine_url, "support@1") is ResidencyTier.HOT

        stream = await client.completions.create(
            model="sales", prompt="a stream", max_tokens=4, stream=True
        )
        models = {chunk.model async for chunk in stream}
        assert models == {"sales@1"}

        with pytest.raises(openai.NotFoundError, match="unknown version"):
            await client.completions.create(model="support@7", prompt="x", max_tokens=2)

        # Canary through the admin API at the router's admin path, then rollback.
        _register(plane, sources, keypair, "support", version="2", seed=9)
        async with httpx.AsyncClient(base_url=url) as http:
            denied = await http.get("/admin/lora/adapters")
            assert denied.status_code == 401
            auth = {"authorization": f"Bearer {ADMIN_KEY}"}
            listed = await http.get("/admin/lora/adapters", headers=auth)
            assert {a["adapter_id"] for a in listed.json()["adapters"]} >= {"support", "sales"}
            r = await http.post(
                "/admin/lora/adapters/support/canary",
                json={"version": "2", "percent": 100},
                headers=auth,
            )
            assert r.status_code == 200, r.text
            answer = await client.completions.create(model="support", prompt="hi", max_tokens=2)
            assert answer.model == "support@2"
            r = await http.post("/admin/lora/adapters/support/rollback", headers=auth)
            assert r.status_code == 200, r.text
            answer = await client.completions.create(model="support", prompt="hi", max_tokens=2)
            assert answer.model == "support@1"
        assert control.manager.metrics.invariants == NO_VIOLATIONS
    finally:
        await client.close()


async def test_budgets_fallback_reject_tenants_and_request_classes(
    plane: ControlPlane,
    sources: Path,
    keypair: tuple[Path, Path],
    fleet: FleetThread,
    tmp_path: Path,
) -> None:
    _register(plane, sources, keypair, "shared-bot", tenant="acme", seed=3)
    _register(plane, sources, keypair, "strict-bot", tenant="strict", seed=4)
    # No cold load fits the interactive budget (the prior predicts 3 s): fallback or 503.
    classes = {
        "interactive": RequestClassBudget(cold_start_budget_s=0.5),
        "background": RequestClassBudget(max_concurrent_cold_loads=2, on_over_budget="reject"),
    }
    control = _control(plane, fleet, tmp_path, request_classes=classes)
    keys = [{"key": "k-acme", "tenant": "acme"}, {"key": "k-strict", "tenant": "strict"}]
    config = router_config(fleet.urls, adapters={"enabled": True}, auth={"api_keys": keys})
    async with serve_router(config, Router(config, lora=control)) as running:
        await _budgets_tenants_classes(f"{running.url}/v1", control, fleet)


async def _budgets_tenants_classes(url: str, control: LoRAControl, fleet: FleetThread) -> None:
    acme = openai.AsyncOpenAI(base_url=url, api_key="k-acme", max_retries=0)
    strict = openai.AsyncOpenAI(base_url=url, api_key="k-strict", max_retries=0)
    try:
        raw = await acme.completions.with_raw_response.create(
            model="shared-bot", prompt="hello", max_tokens=2
        )
        assert raw.parse().model == "toy-base"  # the base model answered
        assert raw.headers["x-kvstack-adapter-fallback"].startswith("base; adapter=shared-bot@1")

        with pytest.raises(openai.APIStatusError) as refused:
            await strict.completions.create(model="strict-bot", prompt="hello", max_tokens=2)
        assert refused.value.status_code == 503
        assert int(refused.value.response.headers["retry-after"]) >= 1

        # Each refusal started a prewarm: soon both adapters are hot somewhere and served.
        async def hot(name: str) -> bool:
            return any(control.manager.residency(u, name) is ResidencyTier.HOT for u in fleet.urls)

        for _ in range(200):
            if await hot("shared-bot@1") and await hot("strict-bot@1"):
                break
            await asyncio.sleep(0.05)
        answer = await strict.completions.create(model="strict-bot", prompt="hi", max_tokens=2)
        assert answer.model == "strict-bot@1"

        # /v1/models: each tenant sees its own adapters only, although the engines list both
        # (loaded under their engine names) and the router reads those lists.
        for client, mine, theirs in ((acme, "shared-bot", "strict-bot"),
                                     (strict, "strict-bot", "shared-bot")):  # fmt: skip
            listed = {m.id for m in (await client.models.list()).data}
            assert mine in listed and "toy-base" in listed
            assert theirs not in listed and not any("@" in m for m in listed), listed

        # Another tenant's adapter does not exist for this key.
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await strict.completions.create(model="shared-bot", prompt="hi", max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="x-kvstack-request-class"):
            await acme.completions.create(
                model="shared-bot",
                prompt="hi",
                max_tokens=2,
                extra_headers={"x-kvstack-request-class": "urgent"},
            )
        # Base-model requests are untouched by the control plane.
        base = await acme.completions.create(model="toy-base", prompt="hi", max_tokens=2)
        assert base.model == "toy-base"
    finally:
        await acme.close()
        await strict.close()


def test_resolution_sets_target_priority_and_tenant_checks(
    plane: ControlPlane,
    sources: Path,
    keypair: tuple[Path, Path],
    fleet: FleetThread,
    tmp_path: Path,
) -> None:
    _register(plane, sources, keypair, "vip", tier="platinum", seed=5)
    control = _control(plane, fleet, tmp_path)
    control.resolver.refresh()
    gate = AdapterStage(control, AdaptersConfig(enabled=True))
    request = parse_request("completions", b'{"model": "vip", "prompt": "x"}', {})
    resolved = gate.resolve(request)
    assert (resolved.model, resolved.target, resolved.priority) == ("vip", "toy-base", "critical")
    # The prefix index keeps the adapter's KV apart from the base model's.
    renderer = PromptRenderer()
    assert renderer.render(resolved, []).namespace.adapter == "vip@1"
    assert (
        renderer.render(
            parse_request("completions", b'{"model": "toy-base", "prompt": "x"}', {}), []
        ).namespace.adapter
        == ""
    )
    explicit = parse_request(
        "completions", b'{"model": "vip", "prompt": "x"}', {"x-kvstack-priority": "sheddable"}
    )
    assert gate.resolve(explicit).priority == "sheddable"
    other = dataclasses.replace(request, tenant="other")
    with pytest.raises(RequestError, match="does not exist"):
        gate.resolve(other)
    open_gate = AdapterStage(control, AdaptersConfig(enabled=True, tenant_isolation=False))
    assert open_gate.resolve(other).target == "toy-base"
    assert [e["id"] for e in gate.listed("other")] == []
    assert [e["id"] for e in gate.listed(None)] == ["vip"]
    base = parse_request("completions", b'{"model": "toy-base", "prompt": "x"}', {})
    assert gate.resolve(base) is base
    assert served_model(b'data: {"id":"c","object":"x","model":"vip@1","choices":[]}') == "vip@1"
    assert served_model(b"not json") is None


async def test_prefill_decode_with_a_managed_adapter(
    plane: ControlPlane,
    sources: Path,
    keypair: tuple[Path, Path],
    fleet: FleetThread,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PD model's adapter request prefills with the adapter its decode engine serves it with,
    on a prefill engine where that adapter is hot; where it is not, the decode engine computes
    the prompt and the adapter loads on the prefill engine for the next request. A decode
    engine's fallback to the base model makes the prefill use the base model too."""
    from kvstack.router.pd import step as pd

    _register(plane, sources, keypair, "support", seed=1)
    _register(plane, sources, keypair, "sales", seed=2)
    classes = {
        "interactive": RequestClassBudget(),
        "background": RequestClassBudget(max_concurrent_cold_loads=2),
        "tight": RequestClassBudget(cold_start_budget_s=0.0),  # never waits: fallback
    }
    control = _control(
        plane, fleet, tmp_path, request_classes=classes,
        load_time_prior_s={"warm": 0.05, "cold": 0.2},
    )  # fmt: skip
    pd_models = {"models": ["toy-base"], "min_remote_prefill_tokens": 16}
    config = router_config(fleet.urls, adapters={"enabled": True}, pd=pd_models, debug_headers=True)
    config.backends[0].role, config.backends[1].role = "prefill", "decode"
    prefill_url, decode_url = fleet.urls
    prefilled: list[str] = []
    real_body = pd.prefill_body

    def spy(request: object, model: str) -> dict[str, object]:
        prefilled.append(model)
        return real_body(request, model)  # type: ignore[arg-type]

    monkeypatch.setattr(pd, "prefill_body", spy)
    prompt = "a long shared document " * 60
    async with serve_router(config, Router(config, lora=control)) as running:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key="x", max_retries=0)
        try:

            async def ask(model: str, **headers: str) -> tuple[str, str, str]:
                raw = await client.completions.with_raw_response.create(
                    model=model, prompt=prompt, max_tokens=3, extra_headers=headers
                )
                return (
                    raw.parse().model,
                    raw.headers["x-kvstack-decision"],
                    raw.headers["x-kvstack-backend"],
                )

            served, decision, backend = await ask("support")
            assert served == "support@1" and decode_url in backend
            assert "pd=adapter_not_hot" in decision and prefilled == []
            for _ in range(200):  # the prefill engine loads it in the background
                if control.manager.residency(prefill_url, "support@1") is ResidencyTier.HOT:
                    break
                await asyncio.sleep(0.05)
            served, decision, backend = await ask("support")
            assert served == "support@1" and decode_url in backend
            assert f"pd=remote:{prefill_url}" in decision and prefilled == ["support@1"]
            prefill_engine = control.manager.engine(prefill_url)
            assert prefill_engine.cache.entries["support@1"].in_flight == 0  # hold released

            served, decision, _ = await ask("sales", **{"x-kvstack-request-class": "tight"})
            assert served == "toy-base" and "pd=remote:" in decision
            assert prefilled == ["support@1", "toy-base"]

            def broken(*_args: object) -> None:
                raise LoRAError("the manager is confused")

            monkeypatch.setattr(control.manager, "hold_for_prefill", broken)
            served, decision, _ = await ask("support")  # the request goes on without a prefill
            assert served == "support@1" and "pd=failed:adapter" in decision
            assert control.manager.metrics.invariants == NO_VIOLATIONS
        finally:
            await client.close()


async def test_a_tampered_stable_version_rolls_back_and_the_previous_one_serves(
    plane: ControlPlane,
    sources: Path,
    keypair: tuple[Path, Path],
    fleet: FleetThread,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The finding: once a stable version failed verification (a tampered file), every
    request fell back to the base model instead of to the last good version."""
    from prometheus_client import REGISTRY

    for version, seed in (("1", 11), ("2", 12)):
        _register(plane, sources, keypair, "guarded", version=version, seed=seed)
    plane.promote("guarded", "2", actor="test")  # it verifies now
    stored = Path(plane.registry.get("guarded", "2").artifact_uri.removeprefix("file://"))
    weights = stored / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x7f")  # altered after the release
    control = _control(plane, fleet, tmp_path, load_time_prior_s={"warm": 0.05, "cold": 0.2})
    config = router_config(fleet.urls, adapters={"enabled": True})
    rollbacks = {"adapter": "guarded", "reason": "digest_mismatch"}
    before = REGISTRY.get_sample_value("kvstack_lora_auto_rollbacks_total", rollbacks) or 0.0
    async with serve_router(config, Router(config, lora=control)) as running:
        client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key="x", max_retries=0)
        try:
            for _ in range(2):
                raw = await client.completions.with_raw_response.create(
                    model="guarded", prompt="hello", max_tokens=2
                )
                assert raw.parse().model == "guarded@1"  # the previous version, not the base
                assert "x-kvstack-adapter-fallback" not in raw.headers
        finally:
            await client.close()
    release = plane.registry.release("guarded")
    assert release is not None and release.stable_version == "1"
    assert plane.registry.get("guarded", "2").status.value == "staged"
    (entry,) = plane.audit.entries("guarded", "auto_rollback")
    assert (entry.actor, entry.version) == ("manager", "2") and "digest_mismatch" in entry.reason
    after = REGISTRY.get_sample_value("kvstack_lora_auto_rollbacks_total", rollbacks)
    assert after == before + 1
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("guarded@2 failed verification" in m and "1 is stable now" in m for m in logged)
    assert control.manager.metrics.invariants == NO_VIOLATIONS
