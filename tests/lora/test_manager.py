"""The cache manager over fake engines: cold, warm and hot; single flight; capacity and pins;
budgets; versions in flight; verification at load; reconciliation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from kvstack.log import IncidentLogger
from kvstack.lora import loader
from kvstack.lora.decision import FALLBACK_HEADER, Action
from kvstack.lora.residency import ResidencyTier
from kvstack.lora.upkeep import ReconcileReport, reconcile, sweep, sync_releases
from tests.lora.adapters import NO_VIOLATIONS
from tests.lora.conftest import Setup

URL = "http://engine-a"


async def test_cold_then_hot_and_audited(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    a = s.add("acme-support")
    d = await s.manager.ensure_hot(URL, a, budget_s=60)
    assert (d.action, d.model, d.start) == (Action.SERVE, "acme-support@1", "cold")
    path = s.driver.engine(URL).loaded["acme-support@1"]
    assert _listdir(Path(path)) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    d.finish(ttft_s=0.2, served_model="acme-support@1")
    again = await s.manager.ensure_hot(URL, a)
    assert (again.action, again.start) == (Action.SERVE, "hot")
    again.finish(ttft_s=0.01)
    load = s.plane.audit.entries(action="load", limit=1)[0]
    assert (load.decision, load.engine, load.digest) == ("accept", URL, a.sha256)
    assert s.manager.metrics.ttft_summary(start="cold").count == 1
    assert s.manager.metrics.invariants == NO_VIOLATIONS


async def test_concurrent_requests_share_one_load(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    a = s.add("acme-support")
    s.driver.engine(URL).load_delay_s = 0.05
    decisions = await asyncio.gather(*(s.manager.ensure_hot(URL, a, budget_s=60) for _ in range(8)))
    assert all(d.action is Action.SERVE for d in decisions)
    assert s.driver.engine(URL).num_loads == 1
    assert len(s.plane.audit.entries(action="load")) == 1


async def test_capacity_demotes_then_drops_least_recent(make_setup: Callable[..., Setup]) -> None:
    s = make_setup(gpu_slots=2, host_slots=3, eviction_policy="lru")
    adapters = [s.add(f"t{i}", seed=i) for i in range(4)]
    for a in adapters[:3]:
        s.clock.now += 1
        (await s.manager.ensure_hot(URL, a, budget_s=60)).finish()
    snap = s.manager.snapshot(URL)
    assert snap.hot == ("t1@1", "t2@1") and snap.warm == ("t0@1",)
    assert set(s.driver.engine(URL).loaded) == {"t1@1", "t2@1"}  # t0 was unloaded
    s.clock.now += 1
    (await s.manager.ensure_hot(URL, adapters[3], budget_s=60)).finish()
    snap = s.manager.snapshot(URL)
    assert snap.hot == ("t2@1", "t3@1") and snap.warm == ("t1@1",)  # t0 dropped to cold
    assert s.manager.residency(URL, "t0@1") is ResidencyTier.COLD
    assert not any(name.startswith("t0@1") for name in _listdir(s.manager.engine(URL).warm_dir))


async def test_in_flight_adapter_is_never_evicted(make_setup: Callable[..., Setup]) -> None:
    s = make_setup(gpu_slots=1, host_slots=2)
    a, b = s.add("a"), s.add("b", seed=1)
    held = await s.manager.ensure_hot(URL, a, budget_s=60)
    blocked = await s.manager.ensure_hot(URL, b, budget_s=60)  # waits slot_wait_s, then gives up
    assert (blocked.action, blocked.reason) == (Action.FALLBACK, "no_free_gpu_slot")
    assert blocked.model == "toy-base" and FALLBACK_HEADER in blocked.headers()
    assert s.manager.residency(URL, "a@1") is ResidencyTier.HOT
    held.finish()
    assert (await s.manager.ensure_hot(URL, b, budget_s=60)).action is Action.SERVE


async def test_load_waits_for_a_slot_to_be_released(make_setup: Callable[..., Setup]) -> None:
    s = make_setup(gpu_slots=1, host_slots=2)
    s.manager.config.slot_wait_s = 10.0
    a, b = s.add("a"), s.add("b", seed=1)
    held = await s.manager.ensure_hot(URL, a, budget_s=60)
    waiting = asyncio.create_task(s.manager.ensure_hot(URL, b, budget_s=60))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # like the engine's scheduler: queued, not refused
    held.finish()
    d = await asyncio.wait_for(waiting, 5)
    assert (d.action, d.model) == (Action.SERVE, "b@1")


async def test_never_evict_rules_hold_under_pressure(make_setup: Callable[..., Setup]) -> None:
    s = make_setup(gpu_slots=2, host_slots=3)
    platinum = [s.add(f"p{i}", tier="platinum", seed=i) for i in range(3)]
    for p in platinum:
        (await s.manager.ensure_hot(URL, p, budget_s=60)).finish()
    for i in range(5):  # pressure: standard adapters want slots
        d = await s.manager.ensure_hot(
            URL, s.add(f"s{i}", tier="standard", seed=10 + i), budget_s=60
        )
        assert (d.action, d.reason) == (Action.FALLBACK, "no_free_host_slot")
    eng = s.manager.engine(URL)
    assert {e.name for e in eng.cache} == {"p0@1", "p1@1", "p2@1"}
    assert s.manager.metrics.invariants["pinned_eviction"] == 0
    # At the GPU tier a pinned adapter yields its slot only to another pinned one.
    assert len(s.manager.snapshot(URL).hot) == 2


async def test_budget_fallback_reject_and_prewarm(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    s.manager.config.tenants.clear()  # no tenant allows fallback now
    a = s.add("acme-support")
    for _ in range(3):
        s.manager.predictor.observe(URL, "cold", 10.0)  # loads have been slow
    d = await s.manager.ensure_hot(URL, a)  # interactive: 2 s budget
    assert (d.action, d.reason) == (Action.REJECT, "predicted_over_budget")
    assert int(d.headers()["retry-after"]) >= 10
    await asyncio.gather(*s.manager.engine(URL).loads.values())  # the prewarm it started
    assert s.manager.residency(URL, "acme-support@1") is ResidencyTier.HOT


async def test_load_exceeding_budget_falls_back_and_finishes(
    make_setup: Callable[..., Setup],
) -> None:
    s = make_setup()
    a = s.add("acme-support")
    for _ in range(3):
        s.manager.predictor.observe(URL, "cold", 0.01)  # loads used to be fast...
    s.driver.engine(URL).load_delay_s = 0.3  # ...but this one is slow
    d = await s.manager.ensure_hot(URL, a, budget_s=0.05)
    assert (d.action, d.reason, d.model) == (Action.FALLBACK, "load_exceeded_budget", "toy-base")
    d.finish(ttft_s=0.1)
    await asyncio.gather(*s.manager.engine(URL).loads.values())
    assert s.manager.residency(URL, "acme-support@1") is ResidencyTier.HOT


async def test_background_cold_loads_are_bounded(make_setup: Callable[..., Setup]) -> None:
    s = make_setup(gpu_slots=8, host_slots=8)
    adapters = [s.add(f"bg{i}", seed=i) for i in range(6)]
    store, active, peak = s.manager.loader.store, [0], [0]
    fetch = store.fetch

    def slow_fetch(*args: object) -> object:
        import time

        active[0] += 1
        peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        active[0] -= 1
        return fetch(*args)  # type: ignore[arg-type]

    store.fetch = slow_fetch  # type: ignore[method-assign]
    decisions = await asyncio.gather(
        *(s.manager.ensure_hot(URL, a, "background") for a in adapters)
    )
    assert all(d.action is Action.SERVE for d in decisions)
    assert peak[0] <= 2  # max_concurrent_cold_loads of the background class


async def test_new_version_loads_beside_old_and_old_retires(
    make_setup: Callable[..., Setup],
) -> None:
    s = make_setup(gpu_slots=3, host_slots=4)
    v1 = s.add("acme-support", "1")
    in_flight = await s.manager.ensure_hot(
        URL, s.manager.resolver.resolve("acme-support"), budget_s=60
    )
    v2 = s.add("acme-support", "2", seed=5)
    s.plane.promote("acme-support", "2", actor="test")
    s.manager.resolver.refresh()
    started = sync_releases(s.manager)  # the new version loads beside the old one
    assert started == [(URL, "acme-support@2")]
    await asyncio.gather(*s.manager.engine(URL).loads.values())
    assert set(s.driver.engine(URL).loaded) == {"acme-support@1", "acme-support@2"}
    new = await s.manager.ensure_hot(URL, s.manager.resolver.resolve("acme-support"))
    assert (new.model, new.start) == ("acme-support@2", "hot")
    in_flight.finish(served_model="acme-support@1")  # the old request kept its version
    await asyncio.sleep(0.01)  # the retirement it triggers
    assert set(s.driver.engine(URL).loaded) == {"acme-support@2"}
    assert s.manager.residency(URL, v1.engine_name) is ResidencyTier.WARM  # kept warm for rollback
    s.plane.rollback("acme-support", actor="test")
    s.manager.resolver.refresh()
    back = await s.manager.ensure_hot(URL, s.manager.resolver.resolve("acme-support"))
    assert (back.model, back.start) == ("acme-support@1", "warm")
    new.finish()
    await asyncio.sleep(0.01)
    assert set(s.driver.engine(URL).loaded) == {"acme-support@1"} and v2.status.value == "staged"
    assert s.manager.metrics.invariants["wrong_version"] == 0


async def test_tampered_store_never_reaches_engine(
    make_setup: Callable[..., Setup],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loader, "incidents", IncidentLogger(loader.log))  # none suppressed yet
    s = make_setup()
    a = s.add("acme-support")
    stored = Path(s.plane.store.root) / a.sha256 / "adapter_model.safetensors"  # type: ignore[attr-defined]
    stored.write_bytes(stored.read_bytes()[:-4] + b"\x00\x00\x00\x01")
    d = await s.manager.ensure_hot(URL, a, budget_s=60)
    assert (d.action, d.reason, d.retry_after_s) == (Action.FALLBACK, "digest_mismatch", None)
    assert s.driver.engine(URL).num_loads == 0
    entry = s.plane.audit.entries(action="load", limit=1)[0]
    assert entry.decision == "reject" and entry.reason.startswith("digest_mismatch")
    assert s.manager.residency(URL, a.engine_name) is ResidencyTier.COLD
    said = [r.getMessage() for r in caplog.records if r.name == "kvstack.lora.loader"]
    assert any(f"not serving adapter {a.engine_name}" in m and "digest_mismatch" in m for m in said)


async def test_wrong_version_answer_is_counted(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    d = await s.manager.ensure_hot(URL, s.add("acme-support"), budget_s=60)
    d.finish(served_model="acme-support@0")
    assert s.manager.metrics.invariants["wrong_version"] == 1


async def test_reconcile_corrects_belief(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    a, b = s.add("a"), s.add("b", seed=1)
    (await s.manager.ensure_hot(URL, a, budget_s=60)).finish()
    (await s.manager.ensure_hot(URL, b, budget_s=60)).finish()
    fake = s.driver.engine(URL)
    del fake.loaded["a@1"]  # the engine restarted or someone unloaded it
    fake.loaded["rogue@1"] = "/tmp/unverified"  # loaded behind our back
    fake.running.add("b@1")
    report = await reconcile(s.manager, s.manager.engine(URL))
    assert (report.lost_hot, report.unloaded, report.busy) == (["a@1"], ["rogue@1"], ["b@1"])
    assert s.manager.residency(URL, "a@1") is ResidencyTier.WARM and "rogue@1" not in fake.loaded
    assert s.manager.engine(URL).cache.is_protected(
        s.manager.engine(URL).cache.entries["b@1"], s.clock.now
    )


async def test_reconcile_leaves_what_changed_after_it_asked(
    make_setup: Callable[..., Setup],
) -> None:
    """The engine's list of loaded adapters is a snapshot: a load that completes, or an unload
    that happens, while it travels is newer. Acting on it would mark a freshly loaded adapter
    lost (refusing the request waiting for it) or unload one twice."""
    s = make_setup(gpu_slots=1)
    a, b = s.add("a"), s.add("b", seed=1)
    (await s.manager.ensure_hot(URL, a, budget_s=60)).finish()
    fake, eng = s.driver.engine(URL), s.manager.engine(URL)
    real_adapters = s.driver.adapters

    async def stale_answer(url: str, timeout_s: float) -> dict[str, str]:
        snapshot = await real_adapters(url, timeout_s)  # a@1 loaded
        (await s.manager.ensure_hot(URL, b, budget_s=60)).finish()  # meanwhile: b in, a out
        return snapshot

    s.driver.adapters = stale_answer  # type: ignore[method-assign]
    report = await reconcile(s.manager, eng)
    assert report.lost_hot == [] and report.unloaded == []
    assert s.manager.residency(URL, "b@1") is ResidencyTier.HOT  # not demoted on the stale answer
    assert s.manager.residency(URL, "a@1") is ResidencyTier.WARM
    assert set(fake.loaded) == {"b@1"}
    s.driver.adapters = real_adapters  # type: ignore[method-assign]
    assert await reconcile(s.manager, eng) == ReconcileReport(URL)  # and the next round agrees


async def test_demote_rules_step_one_tier(make_setup: Callable[..., Setup]) -> None:
    s = make_setup()
    a = s.add("acme-support")
    (await s.manager.ensure_hot(URL, a, budget_s=60)).finish()
    eng = s.manager.engine(URL)
    assert await sweep(s.manager, eng) == []
    s.clock.now += 61 * 60
    assert await sweep(s.manager, eng) == [("acme-support@1", "no_request_for_minutes > 60")]
    assert s.manager.residency(URL, a.engine_name) is ResidencyTier.WARM
    await sweep(s.manager, eng)
    assert s.manager.residency(URL, a.engine_name) is ResidencyTier.COLD


def _listdir(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


async def test_affinity_prefers_hot_then_warm_then_a_stable_home(
    make_setup: Callable[..., Setup],
) -> None:
    s = make_setup(num_engines=2, gpu_slots=1, host_slots=2)
    urls = ["http://engine-a", "http://engine-b"]
    a, b = s.add("a"), s.add("b", seed=1)
    cold = s.manager.affinity("a@1", urls)
    assert sorted(cold.values()) == pytest.approx([0.2, 0.6])
    assert s.manager.affinity("a@1", urls) == cold  # the same home every time
    home = max(cold, key=cold.__getitem__)
    (await s.manager.ensure_hot(home, a, budget_s=60)).finish()
    assert s.manager.affinity("a@1", urls)[home] == 1.0
    (await s.manager.ensure_hot(home, b, budget_s=60)).finish()  # a: demoted to warm
    assert s.manager.affinity("a@1", urls)[home] == 0.8


def test_pick_engine_prefers_a_queue_over_a_cold_start() -> None:
    from kvstack.lora.affinity import pick_engine

    scores = {"a": 0.8, "b": 0.6, "c": 0.2}  # warm on a, cold elsewhere (b is its home)
    assert pick_engine(scores, {"a": 8, "b": 0, "c": 0}, slack=8) == "a"
    assert pick_engine(scores, {"a": 20, "b": 0, "c": 0}, slack=8) == "a"  # queue, not cold
    assert pick_engine({"a": 0.2, "b": 0.6, "c": 0.4}, {"a": 0, "b": 5, "c": 0}, 8) == "b"
    assert pick_engine(scores, {"a": 40, "b": 0, "c": 0}, slack=8) == "b"  # badly overloaded
