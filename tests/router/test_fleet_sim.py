"""The default policy on a simulated fleet: three ``SimEngine``s publishing vLLM KV events on
loopback, the router in this event loop with the simulator's tokenizer (exact token ids) and a
subscription per engine.

- requests of the same group concentrate where their prefix is cached;
- a single hot prefix still spreads once its holder is busy (a burst);
- precise mode follows the evictions that the events report;
- under overload, sheddable requests get 429 while critical ones are served.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from kvstack.index.radix import Owner, RadixNamespace
from kvstack.router.prefix.state import PrefixState
from kvstack.sim.config import SimConfig
from kvstack.sim.server import FleetThread, fleet_specs
from kvstack.stack.ports import free_port_run
from tests.router.conftest import RouterFactory, until

pytestmark = pytest.mark.slow

SIM = {
    "block_size": 16,
    "num_blocks": 320,  # 5,120 tokens per engine: a few prompts, then evictions
    "prefill_tokens_per_s": 20000.0,
    "step_base_s": 0.002,
    "max_num_batched_tokens": 2048,
}


def words(start: int, n: int) -> str:
    return " ".join(f"t{i}" for i in range(start, start + n))


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetThread]:
    events, replay = free_port_run(3), free_port_run(3)
    config = SimConfig(
        **SIM,
        kv_events_endpoint=f"tcp://*:{events}",
        kv_events_replay_endpoint=f"tcp://*:{replay}",
    )
    with FleetThread(fleet_specs(config, 3, free_port_run(3), "127.0.0.1")) as f:
        f.event_ports = [events + i for i in range(3)]  # type: ignore[attr-defined]
        f.replay_offset = replay - events  # type: ignore[attr-defined]
        yield f


def overrides(fleet: FleetThread, **extra: Any) -> dict[str, Any]:
    """The router of these tests: the default policy, exact tokens, one subscription per
    engine with its replay socket (a new router subscribes mid-stream and replays)."""
    ports = fleet.event_ports  # type: ignore[attr-defined]
    sources = {url: f"tcp://127.0.0.1:{p}" for url, p in zip(fleet.urls, ports, strict=True)}
    events = {"sources": sources, "replay_port_offset": fleet.replay_offset}  # type: ignore[attr-defined]
    return {
        "policy": "ttft",
        "prefix": {"tokenizers": {"sim-model": "sim"}, "events": events},
        "health": {"interval_s": 0.2, "timeout_s": 3.0},
        **extra,
    }


def reset(fleet: FleetThread) -> None:
    async def clear() -> None:
        async with aiohttp.ClientSession() as http:
            for url in fleet.urls:
                async with http.post(url + "/reset_prefix_cache") as r:
                    assert r.status == 200

    asyncio.run_coroutine_threadsafe(clear(), fleet._loop).result(10)  # type: ignore[arg-type]


async def complete(
    http: aiohttp.ClientSession, url: str, prompt: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 4, "stream": True}
    async with http.post(f"{url}/v1/completions", json=body, headers=headers or {}) as r:
        await r.read()
        return r.status, r.headers.get("x-kvstack-backend", "")


def prefix_of(router: Any) -> PrefixState:
    state = router.context.services["prefix"]
    assert isinstance(state, PrefixState)
    return state


async def test_groups_concentrate_where_their_prefix_is(
    fleet: FleetThread, run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    reset(fleet)
    async with run_router(fleet.urls, **overrides(fleet)) as r:
        state = prefix_of(r.router)
        systems = [words(1000 + 2000 * g, 600) for g in range(3)]
        placed: dict[int, Counter[str]] = {g: Counter() for g in range(3)}
        for round_ in range(4):
            if round_ == 1:  # every engine has published by now: the router replayed it all
                await until(lambda: all(state.is_precise(s.id) for s in r.router.pool.states()))
            for g, system in enumerate(systems):
                status, backend = await complete(http, r.url, f"{system} {words(100 + round_, 20)}")
                assert status == 200
                placed[g][backend] += 1
        for g, where in placed.items():
            assert len(where) == 1, f"group {g} spread over {dict(where)}"
        # Precise mode: the engines' own events say where the prefixes are.
        tokens = [int(w[1:]) for w in systems[0].split()]
        holder = next(iter(placed[0]))
        match = state.index.match(RadixNamespace("sim-model"), tokens)
        assert match.tokens(Owner(holder, "gpu")) >= 592


async def test_a_hot_prefix_spreads_when_its_holder_is_busy(
    fleet: FleetThread, run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    reset(fleet)
    async with run_router(fleet.urls, **overrides(fleet)) as r:
        hot = words(5000, 1500)
        await complete(http, r.url, f"{hot} warm")
        burst = [complete(http, r.url, f"{hot} {words(9000 + 5 * i, 200)}") for i in range(24)]
        results = await asyncio.gather(*burst)
        spread = Counter(backend for _, backend in results)
        assert all(status == 200 for status, _ in results)
        assert len(spread) == 3 and max(spread.values()) <= 18, dict(spread)


async def test_precise_mode_follows_evictions(
    fleet: FleetThread, run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    reset(fleet)
    one = fleet.urls[:1]
    async with run_router(one, **overrides(fleet)) as r:
        state = prefix_of(r.router)
        backend = r.router.pool.states()[0].id
        first = words(20000, 1000)
        await complete(http, r.url, first)
        await until(lambda: state.is_precise(backend))
        tokens = [int(w[1:]) for w in first.split()]
        ns = RadixNamespace("sim-model")
        gpu = Owner(backend, "gpu")
        await until(lambda: state.index.match(ns, tokens).tokens(gpu) >= 992)
        for i in range(6):  # 6,000 more tokens through a 5,120-token cache: the first goes
            await complete(http, r.url, words(30000 + 1000 * i, 1000))
        await until(lambda: state.index.match(ns, tokens).tokens(gpu) < 992)
        assert state.trackers[backend].stats.removed > 0
        state.index.check_integrity()


async def test_overload_sheds_sheddable_and_serves_critical(
    fleet: FleetThread, run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    reset(fleet)
    admission = {"name": "priority", "args": {"saturation": {"max_pending": 2}}}
    granted = {"default_max_priority": "critical"}
    async with run_router(fleet.urls, **overrides(fleet, admission=admission, **granted)) as r:
        await until(lambda: all(s.engine is not None for s in r.router.pool.states()))
        long = [complete(http, r.url, words(40000 + 4000 * i, 4000)) for i in range(12)]
        flood = asyncio.gather(*long)
        await until(lambda: all(s.pending >= 2 for s in r.router.pool.states()))
        shed = await complete(http, r.url, "t1 t2 t3", {"x-kvstack-priority": "sheddable"})
        critical = await complete(http, r.url, "t4 t5 t6", {"x-kvstack-priority": "critical"})
        assert shed[0] == 429 and critical[0] == 200
        assert all(status == 200 for status, _ in await flood)


async def test_a_router_tokenizing_unlike_the_engine_falls_back_to_approximate(
    fleet: FleetThread, run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    reset(fleet)
    config = overrides(fleet)
    config["prefix"]["tokenizers"] = {"sim-model": "sim:1000"}  # exact, but not the engine's
    async with run_router(fleet.urls[:1], **config) as r:
        state = prefix_of(r.router)
        backend = r.router.pool.states()[0].id
        await complete(http, r.url, words(60000, 600))
        await until(lambda: state.is_precise(backend))
        for i in range(20):
            await complete(http, r.url, words(61000 + 700 * i, 600))
        assert not state.is_precise(backend)
        assert "tokenizes differently" in state.modes[backend].invalid
