"""In-process stand-ins for fast manager tests: an engine driver with vLLM's semantics
(idempotent load/unload, /v1/models view, running adapters) and a manual clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kvstack.errors import AdapterLoadError
from kvstack.lora.driver import EngineLoRAInfo


@dataclass
class ManualClock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeEngine:
    loaded: dict[str, str] = field(default_factory=dict)  # name -> path
    running: set[str] = field(default_factory=set)
    num_loads: int = 0
    num_unloads: int = 0
    load_delay_s: float = 0.0
    fail_loads: str | None = None  # reason to fail every load with


class FakeDriver:
    def __init__(self) -> None:
        self.engines: dict[str, FakeEngine] = {}
        self.concurrent_loads = 0
        self.max_concurrent_loads = 0

    def engine(self, url: str) -> FakeEngine:
        return self.engines.setdefault(url, FakeEngine())

    async def load(self, url: str, name: str, path: str, timeout_s: float) -> None:
        eng = self.engine(url)
        self.concurrent_loads += 1
        self.max_concurrent_loads = max(self.max_concurrent_loads, self.concurrent_loads)
        try:
            await asyncio.sleep(eng.load_delay_s)
        finally:
            self.concurrent_loads -= 1
        if eng.fail_loads:
            raise AdapterLoadError(eng.fail_loads, f"{name} on {url}")
        if name in eng.loaded and eng.loaded[name] != path:
            raise AdapterLoadError("name_conflict", name)
        eng.loaded[name] = path
        eng.num_loads += 1

    async def unload(self, url: str, name: str, timeout_s: float) -> None:
        eng = self.engine(url)
        if eng.loaded.pop(name, None) is not None:
            eng.num_unloads += 1

    async def adapters(self, url: str, timeout_s: float) -> dict[str, str]:
        return dict(self.engine(url).loaded)

    async def lora_info(self, url: str, timeout_s: float) -> EngineLoRAInfo | None:
        running = frozenset(self.engine(url).running)
        return EngineLoRAInfo(running, frozenset(), None)
