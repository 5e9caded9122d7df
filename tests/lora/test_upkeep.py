"""Upkeep: adopting warm files after a restart, canary shadow prewarm, scheduled warmups on
home engines, and LoRAControl wiring it all from config."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from kvstack.errors import ConfigError
from kvstack.lora.config import ScheduledWarmup
from kvstack.lora.control import LoRAControl
from kvstack.lora.manager import AdapterCacheManager
from kvstack.lora.residency import ResidencyTier
from kvstack.lora.upkeep import Upkeep, adopt_warm_dir, reconcile, run_warmups, sync_releases
from kvstack.lora.warmup import WarmupSchedule
from tests.lora.conftest import ENGINE_URLS, Setup
from tests.lora.fakes import FakeDriver

URL = ENGINE_URLS[0]


async def test_restart_adopts_verified_warm_files_only(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    a, b = s.add("a"), s.add("b", seed=1)
    for adapter in (a, b):
        (await s.manager.ensure_hot(URL, adapter, budget_s=60)).finish()
    warm_dir = s.manager.engine(URL).warm_dir
    (warm_dir / "junk").mkdir()
    tampered = next(p for p in _dirs(warm_dir) if p.name.startswith("b@1-"))
    (tampered / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4}')
    await s.manager.aclose()

    m = AdapterCacheManager(
        s.manager.config,
        s.manager.resolver,
        s.plane.store,
        s.plane.verifier,
        s.plane.audit,
        FakeDriver(),
        s.clock,
    )
    adopted = await adopt_warm_dir(m, m.engine(URL))
    assert adopted == ["a@1"] and m.residency(URL, "a@1") is ResidencyTier.WARM
    assert m.residency(URL, "b@1") is ResidencyTier.COLD
    assert sorted(p.name.split("-")[0] for p in _dirs(warm_dir)) == ["a@1"]
    d = await m.ensure_hot(URL, a, budget_s=60)  # served from the adopted copy
    assert d.start == "warm"
    d.finish()
    await m.aclose()


async def test_canary_is_shadow_prewarmed_where_stable_is_hot(
    make_setup: Callable[..., Setup],
) -> None:
    s = make_setup(num_engines=2)
    s.add("a", "1")
    stable_engine = ENGINE_URLS[1]
    (
        await s.manager.ensure_hot(stable_engine, s.manager.resolver.resolve("a"), budget_s=60)
    ).finish()
    s.add("a", "2", seed=2, activate=False)
    s.plane.canary("a", "2", 0.0, actor="test")  # staged as canary, no traffic yet
    s.manager.resolver.refresh()
    assert sync_releases(s.manager) == [(stable_engine, "a@2")]
    await asyncio.gather(*s.manager.engine(stable_engine).loads.values())
    assert s.manager.residency(stable_engine, "a@2") is ResidencyTier.HOT
    assert sync_releases(s.manager) == []  # one engine is enough (canary_prewarm_engines=1)


async def test_scheduled_warmup_on_home_engines(make_setup: Callable[..., Setup]) -> None:
    s = make_setup(num_engines=2)
    for i in range(4):
        s.add(f"p{i}", tier="platinum", seed=i)
    s.add("g0", tier="gold", seed=9)
    rule = "tenant_priority == 'platinum' and home_rank < 1"
    s.manager.warmups = WarmupSchedule([ScheduledWarmup(select=rule)], s.clock.now)
    started = run_warmups(s.manager)
    assert sorted(name for _, name in started) == ["p0@1", "p1@1", "p2@1", "p3@1"]  # once each
    for url, name in started:
        assert s.manager.home_rank(url, s.manager.resolver.version(name[:2], "1")) == 0  # type: ignore[arg-type]
    for eng in s.manager.engines.values():
        await asyncio.gather(*eng.loads.values())
    assert all(s.manager.residency(u, n) is ResidencyTier.WARM for u, n in started)
    assert run_warmups(s.manager) == []  # a startup warmup fires once


async def test_control_from_config(tmp_path: Path, make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    config = s.manager.config.model_dump(mode="python")
    config["base_models"] = {"toy": {"path": str(_toy_config(tmp_path / "base"))}}
    driver = FakeDriver()
    control = LoRAControl.from_config(config, driver=driver)
    with pytest.raises(ConfigError, match="admin_key"):
        control.admin_app()
    a = s.add("a")
    await control.start()  # refreshes the registry, reconciles, sweeps
    assert control.resolver.resolve("a") is not None
    d = await control.manager.ensure_hot(URL, control.resolver.resolve("a"), budget_s=60)
    assert (d.model, d.reason) == ("a@1", "") and driver.engine(URL).loaded
    d.finish()
    await control.stop()
    assert isinstance(control.upkeep, Upkeep) and a.engine_name == "a@1"


def _dirs(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.is_dir()]


def _toy_config(path: Path) -> Path:
    from tests.lora.adapters import TINY_DIMS

    path.mkdir(parents=True)
    return TINY_DIMS.write_config_dir(path)


async def test_two_routers_share_an_engine(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    a = s.add("a")
    (await s.manager.ensure_hot(URL, a, budget_s=60)).finish()
    other = AdapterCacheManager(
        s.manager.config,
        s.manager.resolver,
        s.plane.store,
        s.plane.verifier,
        s.plane.audit,
        s.driver,
        s.clock,
    )
    report = await reconcile(other, other.engine(URL))
    assert (report.adopted_hot, report.unloaded) == (["a@1"], [])  # verified, not unloaded
    assert other.residency(URL, "a@1") is ResidencyTier.HOT and "a@1" in s.driver.engine(URL).loaded
    await other.aclose()
