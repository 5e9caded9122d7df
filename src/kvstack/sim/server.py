"""Serve one or many simulated engines from one process: one uvicorn server per port, all in
one event loop (uvloop when installed), so a 16-engine fleet costs one process, not sixteen.

Engines configured with the same ``kv_tiers`` share one :class:`~kvstack.sim.tier.TierLink`,
so a ``cpu://`` tier acts as a store shared by the whole fleet; engines with the same
vocabulary share one tokenizer (its word memo). For a fleet, KV event
endpoints ending in ``:PORT`` are offset by the engine index (``PORT + i``), vLLM's rule for
data-parallel ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import uvicorn

from kvstack.sim.app import build_app
from kvstack.sim.config import SimConfig
from kvstack.sim.engine import SimEngine
from kvstack.sim.tier import TierLink
from kvstack.sim.tokenizer import SimTokenizer

__all__ = ["FleetThread", "SimEngineSpec", "fleet_specs", "run_fleet", "serve_fleet"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class SimEngineSpec:
    config: SimConfig
    port: int
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The fleet handles SIGINT/SIGTERM once for all its servers.
        yield


def offset_endpoint(endpoint: str | None, index: int) -> str | None:
    if not endpoint or index == 0:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"fleet KV event endpoint {endpoint!r} must end with :PORT")
    return f"{base}:{int(port) + index}"


def fleet_specs(config: SimConfig, num: int, base_port: int, host: str) -> list[SimEngineSpec]:
    """``num`` engines on consecutive ports, KV event endpoints offset per engine."""
    specs = []
    for i in range(num):
        updates = {
            "kv_events_endpoint": offset_endpoint(config.kv_events_endpoint, i),
            "kv_events_replay_endpoint": offset_endpoint(config.kv_events_replay_endpoint, i),
        }
        specs.append(SimEngineSpec(config.model_copy(update=updates), base_port + i, host))
    return specs


class SimServerFleet:
    """Engines and their HTTP servers; ``await fleet.serve()`` until ``fleet.stop()``."""

    def __init__(self, specs: Sequence[SimEngineSpec]) -> None:
        tiers: dict[tuple[str, ...], TierLink] = {}
        # One tokenizer per vocabulary: its word memo is the same for every engine.
        tokenizers: dict[int, SimTokenizer] = {}
        self.engines: list[SimEngine] = []
        self.servers: list[_Server] = []
        for spec in specs:
            tier = None
            if spec.config.kv_tiers:
                key = tuple(spec.config.kv_tiers)
                tier = tiers.get(key) or tiers.setdefault(key, TierLink.from_config(spec.config))
            vocab = spec.config.vocab_size
            tokenizer = tokenizers.setdefault(vocab, SimTokenizer(vocab))
            engine = SimEngine(spec.config, tier=tier, tokenizer=tokenizer)
            self.engines.append(engine)
            uv = uvicorn.Config(
                build_app(engine), host=spec.host, port=spec.port, log_level="warning",
                access_log=False, lifespan="off", timeout_keep_alive=60, backlog=4096,
            )  # fmt: skip
            self.servers.append(_Server(uv))
        self._tiers = list(tiers.values())

    def stop(self) -> None:
        for server in self.servers:
            server.should_exit = True

    @property
    def started(self) -> bool:
        return all(s.started for s in self.servers)

    async def serve(self) -> None:
        for engine in self.engines:
            engine.start()
        try:
            await asyncio.gather(*(s.serve() for s in self.servers))
        finally:
            for engine in self.engines:
                await engine.stop()
            for tier in self._tiers:
                tier.close()


async def serve_fleet(specs: Sequence[SimEngineSpec]) -> None:
    """Serve until SIGINT or SIGTERM."""
    fleet = SimServerFleet(specs)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, fleet.stop)
    log.info("serving %d simulated engine(s): %s", len(specs), ", ".join(s.url for s in specs))
    await fleet.serve()


def run_fleet(specs: Sequence[SimEngineSpec]) -> None:
    """Run :func:`serve_fleet` on uvloop when available."""
    try:
        import uvloop
    except ImportError:  # the plain asyncio loop works, only slower
        asyncio.run(serve_fleet(specs))
        return
    uvloop.run(serve_fleet(specs))


class FleetThread:
    """A fleet in a background thread (tests and in-process tools): ``with FleetThread(specs)``."""

    def __init__(self, specs: Sequence[SimEngineSpec], start_timeout_s: float = 10.0) -> None:
        self.specs = list(specs)
        self.start_timeout_s = start_timeout_s
        self.fleet: SimServerFleet | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="sim-fleet", daemon=True)
        self._error: BaseException | None = None

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.specs]

    @property
    def engines(self) -> list[SimEngine]:
        assert self.fleet is not None
        return self.fleet.engines

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self.fleet = SimServerFleet(self.specs)
            loop.run_until_complete(self.fleet.serve())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
        finally:
            loop.close()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the fleet's loop and return its result (safe inspection)."""
        assert self._loop is not None

        async def call() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def __enter__(self) -> FleetThread:
        import time

        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not (self.fleet is not None and self.fleet.started):
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"simulated fleet failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("simulated fleet did not start in time")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fleet is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.fleet.stop)
        self._thread.join(10)
