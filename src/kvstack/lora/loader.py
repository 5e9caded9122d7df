"""The I/O behind residency changes: materialise (fetch, verify, place), engine load, unload,
drop. Every load decision is audited with its phases' latency; every failure is counted by
reason. Operations on one (engine, adapter) are serialised by a per-name lock, and the engine
is only ever given a path this process verified (the ``unverified_load`` invariant).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kvstack.errors import AdapterLoadError, VerificationError
from kvstack.log import IncidentLogger
from kvstack.lora.adapters import AdapterVersion
from kvstack.lora.audit import AuditEntry, AuditLog
from kvstack.lora.config import AdapterEngineSpec, LoRAConfig
from kvstack.lora.driver import EngineDriver
from kvstack.lora.metrics import LoRAMetrics
from kvstack.lora.predict import LoadTimePredictor
from kvstack.lora.residency import EngineCache, Entry, ResidencyTier, State
from kvstack.lora.stats import StatsTable
from kvstack.lora.store import ArtifactStore
from kvstack.lora.verify import Verifier

__all__ = ["MARKER_SUFFIX", "AdapterLoader", "EngineState", "remove_warm_copy"]

log = logging.getLogger(__name__)
incidents = IncidentLogger(log)
T = TypeVar("T")
MARKER_SUFFIX = ".verified.json"


@dataclass
class EngineState:
    spec: AdapterEngineSpec
    cache: EngineCache
    stats: StatsTable
    warm_dir: Path
    engine_dir: str
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    loads: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    cold_slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    verified: set[str] = field(default_factory=set)  # engine-side paths verified here
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    def notify_released(self) -> None:
        """An entry stopped being in use: wake loads waiting for a slot."""
        self._released.set()
        self._released = asyncio.Event()

    async def wait_released(self, timeout_s: float) -> None:
        """Until an entry is released or ``timeout_s`` passes (re-check either way)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), timeout=max(0.0, timeout_s))

    def lock(self, name: str) -> asyncio.Lock:
        return self.locks.setdefault(name, asyncio.Lock())

    def cold_slot(self, request_class: str, limit: int | None) -> asyncio.Semaphore | None:
        if limit is None:
            return None
        return self.cold_slots.setdefault(request_class, asyncio.Semaphore(limit))

    def dir_name(self, adapter: AdapterVersion) -> str:
        return f"{adapter.engine_name}-{adapter.sha256[:12]}"


class AdapterLoader:
    def __init__(
        self,
        config: LoRAConfig,
        store: ArtifactStore,
        verifier: Verifier,
        driver: EngineDriver,
        predictor: LoadTimePredictor,
        metrics: LoRAMetrics,
        audit: AuditLog | None,
        clock: Callable[[], float],
        protected: Callable[[AdapterVersion], bool],
    ) -> None:
        self.config = config
        self.store = store
        self.verifier = verifier
        self.driver = driver
        self.predictor = predictor
        self.metrics = metrics
        self.audit = audit
        self.clock = clock
        self.protected = protected
        # Store fetches can block for seconds; they get their own threads so that they never
        # starve the loop's default executor (audit writes, registry refreshes).
        self._io = ThreadPoolExecutor(config.io_threads, thread_name_prefix="lora-io")

    async def _io_call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def close(self) -> None:
        self._io.shutdown(wait=False, cancel_futures=True)

    async def make_hot(
        self, eng: EngineState, adapter: AdapterVersion, cold_slot: asyncio.Semaphore | None
    ) -> None:
        """Bring ``adapter`` to the hot tier on ``eng`` (idempotent). Raises AdapterLoadError or
        VerificationError; the audit log and metrics have the reason either way."""
        name = adapter.engine_name
        async with eng.lock(name):
            start, waited = self.clock(), 0.0
            tier = eng.cache.residency(name)
            if tier is ResidencyTier.HOT:
                return
            try:
                if tier is ResidencyTier.COLD:
                    waited += await self._materialise_slot(eng, adapter, cold_slot)
                waited += await self._engine_load(eng, adapter)
            except (AdapterLoadError, VerificationError) as exc:
                await self._record_failure(eng, adapter, exc, start)
                raise
        elapsed = self.clock() - start
        # Predictions are of the work (fetch, verify, engine load); waits for a free slot are
        # queueing that depends on the moment, and would make every later prediction too long.
        work_s = max(0.0, elapsed - waited)
        self.predictor.observe(eng.spec.url, tier.value, work_s)
        eng.stats.get(name).load_s[tier.value] = work_s
        self.metrics.load_phase(adapter.adapter_id, "total", elapsed, self.protected(adapter))
        await self._audit(eng, adapter, "load", "accept", f"from {tier.value}", elapsed)

    async def make_warm(
        self, eng: EngineState, adapter: AdapterVersion, cold_slot: asyncio.Semaphore | None
    ) -> None:
        """Materialise ``adapter`` on the engine host without loading it (prewarm)."""
        start = self.clock()
        async with eng.lock(adapter.engine_name):
            if eng.cache.residency(adapter.engine_name) is not ResidencyTier.COLD:
                return
            try:
                await self._materialise_slot(eng, adapter, cold_slot)
            except (AdapterLoadError, VerificationError) as exc:
                await self._record_failure(eng, adapter, exc, start)
                raise
        await self._audit(eng, adapter, "prewarm", "accept", "to warm", self.clock() - start)

    async def demote(self, eng: EngineState, name: str, reason: str) -> None:
        """Hot -> warm: unload from the engine (the cache already counts it warm)."""
        entry = eng.cache.entries.get(name)
        async with eng.lock(name):
            try:
                await self.driver.unload(eng.spec.url, name, self.config.engine_timeout_s)
            except AdapterLoadError as exc:  # reconciliation will see it still loaded and retry
                log.warning("unload of %s on %s failed: %s", name, eng.spec.url, exc)
        if entry is not None:
            self.metrics.eviction(
                entry.adapter.adapter_id, "hot", reason, self.protected(entry.adapter)
            )

    async def drop(self, eng: EngineState, entry: Entry, reason: str, pinned: bool) -> None:
        """Warm -> cold: delete the files (unloading first if the engine still has it)."""
        if pinned:
            self.metrics.violation("pinned_eviction")
        async with eng.lock(entry.name):
            if entry.tier is ResidencyTier.HOT:
                await self.driver.unload(eng.spec.url, entry.name, self.config.engine_timeout_s)
            eng.verified.discard(entry.path)
            target = eng.warm_dir / Path(entry.path).name
            await self._io_call(remove_warm_copy, target)
        self.metrics.eviction(
            entry.adapter.adapter_id, "warm", reason, self.protected(entry.adapter)
        )

    # -- steps ----------------------------------------------------------------------------

    async def _materialise_slot(
        self, eng: EngineState, adapter: AdapterVersion, cold_slot: asyncio.Semaphore | None
    ) -> float:
        """Reserve a warm slot and materialise; returns the seconds spent waiting for a slot."""
        path = f"{eng.engine_dir.rstrip('/')}/{eng.dir_name(adapter)}"
        began = self.clock()
        victims = await self._until_slot(
            eng,
            lambda: eng.cache.begin_materialise(adapter, path, self.clock()),
            "no_free_host_slot",
            "every warm adapter is in use or pinned",
        )
        for victim in victims:
            await self.drop(eng, victim, "capacity", eng.cache.is_pinned(victim, self.clock()))
        try:
            async with AsyncExitStack() as stack:
                if cold_slot is not None:
                    await stack.enter_async_context(cold_slot)
                waited = self.clock() - began
                await self._materialise(eng, adapter, path)
        except BaseException:
            eng.cache.drop(adapter.engine_name)
            raise
        eng.cache.set_state(adapter.engine_name, State.WARM)
        eng.stats.get(adapter.engine_name).on_load(self.clock())
        return waited

    async def _materialise(self, eng: EngineState, adapter: AdapterVersion, path: str) -> None:
        self.verifier.check_compatible(adapter, eng.spec)  # before any byte moves
        final = eng.warm_dir / Path(path).name
        tmp = eng.warm_dir / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        protected = self.protected(adapter)
        try:
            t0 = self.clock()
            await self._io_call(
                self.store.fetch, adapter.artifact_uri, tmp, self.config.max_adapter_bytes
            )
            t1 = self.clock()
            await self._io_call(self.verifier.verify_for_engine, tmp, adapter, eng.spec)
            t2 = self.clock()
            await self._io_call(_place, tmp, final, adapter)
        finally:
            await self._io_call(remove_warm_copy, tmp)
        eng.verified.add(path)
        self.metrics.load_phase(adapter.adapter_id, "fetch", t1 - t0, protected)
        self.metrics.load_phase(adapter.adapter_id, "verify", t2 - t1, protected)

    async def _engine_load(self, eng: EngineState, adapter: AdapterVersion) -> float:
        """Reserve a hot slot and load; returns the seconds spent waiting for a slot."""
        name, began = adapter.engine_name, self.clock()
        entry = eng.cache.entries[name]
        if entry.path not in eng.verified:  # cannot happen unless a bug bypassed _materialise
            self.metrics.violation("unverified_load")
            raise AdapterLoadError("unverified", f"{entry.path} was not verified by this process")

        def begin() -> list[Entry] | None:
            if name not in eng.cache.entries:
                raise AdapterLoadError(
                    "evicted_while_waiting", f"{name} left {eng.spec.url}'s host"
                )
            return eng.cache.begin_hot(name, self.clock())

        victims = await self._until_slot(
            eng, begin, "no_free_gpu_slot", "every hot adapter is in use"
        )
        now = self.clock()
        await asyncio.gather(*(self.demote(eng, v.name, "capacity") for v in victims))
        try:
            await self.driver.load(eng.spec.url, name, entry.path, self.config.engine_timeout_s)
        except BaseException:
            if name in eng.cache.entries:
                eng.cache.set_state(name, State.WARM)
            raise
        eng.cache.set_state(name, State.HOT)
        eng.stats.get(name).on_load(self.clock())
        self.metrics.load_phase(
            adapter.adapter_id, "engine_load", self.clock() - now, self.protected(adapter)
        )
        return now - began

    async def _until_slot(
        self, eng: EngineState, begin: Callable[[], list[Entry] | None], reason: str, why: str
    ) -> list[Entry]:
        """Retry ``begin`` whenever an entry is released, for up to ``slot_wait_s``: like the
        engine's scheduler, a load waits for a slot rather than failing while all are busy."""
        deadline = time.monotonic() + self.config.slot_wait_s
        while (victims := begin()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AdapterLoadError(reason, f"{why} on {eng.spec.url}")
            await eng.wait_released(min(remaining, 1.0))
        return victims

    async def _record_failure(
        self,
        eng: EngineState,
        adapter: AdapterVersion,
        exc: AdapterLoadError | VerificationError,
        start: float,
    ) -> None:
        self.metrics.load_failure(adapter.adapter_id, exc.reason, self.protected(adapter))
        incidents.warning(  # the request then gets a 404 or 503: say why the adapter is skipped
            f"skip:{adapter.engine_name}:{exc.reason}",
            "not serving adapter %s on %s: %s",
            adapter.engine_name,
            eng.spec.url,
            exc,
        )
        await self._audit(eng, adapter, "load", "reject", str(exc), self.clock() - start)

    async def _audit(
        self,
        eng: EngineState,
        adapter: AdapterVersion,
        action: str,
        decision: str,
        reason: str,
        elapsed_s: float,
    ) -> None:
        if self.audit is None:
            return
        entry = AuditEntry(
            "manager",
            action,
            adapter.adapter_id,
            adapter.version,
            decision,
            reason,
            adapter.sha256,
            elapsed_s * 1000.0,
            eng.spec.url,
        )
        await self.audit.record_async(entry)


def _place(tmp: Path, final: Path, adapter: AdapterVersion) -> None:
    """Move verified files into place and leave a marker naming what they are."""
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    marker = {
        "adapter_id": adapter.adapter_id,
        "version": adapter.version,
        "sha256": adapter.sha256,
    }
    Path(f"{final}{MARKER_SUFFIX}").write_text(json.dumps(marker))


def remove_warm_copy(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    Path(f"{path}{MARKER_SUFFIX}").unlink(missing_ok=True)
