"""Keeping belief true and the caches tidy, in the background.

- :func:`reconcile`: asks the engine what it has loaded (``/v1/models``) and runs
  (``vllm:lora_requests_info``) and corrects the manager's belief: an adapter the engine lost is
  warm again, one it runs is protected, one it holds that this manager did not verify is unloaded
  (nothing unverified stays on an engine); warm files that vanished are forgotten.
- :func:`sweep`: applies ``demote_when`` rules one tier at a time and retires superseded versions.
- :func:`sync_releases`: shadow-prewarms canaries on a few engines before they take traffic and
  loads a new stable version beside the old one wherever the old one is hot.
- :func:`run_warmups`: scheduled warmups whose window opened.
- :class:`Upkeep` runs them all periodically.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvstack.errors import LoRAError, VerificationError
from kvstack.log import IncidentLogger
from kvstack.lora.adapters import AdapterVersion, Status
from kvstack.lora.loader import MARKER_SUFFIX, EngineState, remove_warm_copy
from kvstack.lora.residency import ResidencyTier, State
from kvstack.lora.serving import retire

if TYPE_CHECKING:
    from kvstack.lora.manager import AdapterCacheManager

__all__ = [
    "ReconcileReport",
    "Upkeep",
    "adopt_warm_dir",
    "reconcile",
    "run_warmups",
    "sweep",
    "sync_releases",
]

log = logging.getLogger(__name__)
_incidents = IncidentLogger(log)


@dataclass
class ReconcileReport:
    engine: str
    lost_hot: list[str] = field(default_factory=list)  # believed hot, not loaded: now warm
    adopted_hot: list[str] = field(default_factory=list)  # loaded and verified here: now hot
    unloaded: list[str] = field(default_factory=list)  # loaded but not ours or over capacity
    lost_warm: list[str] = field(default_factory=list)  # files gone: now cold
    busy: list[str] = field(default_factory=list)  # reported running or waiting


async def reconcile(m: AdapterCacheManager, eng: EngineState) -> ReconcileReport:
    url, timeout = eng.spec.url, m.config.engine_timeout_s
    # The engine's answers describe it as of the question: whatever this manager changed while
    # they travelled (a load that completed, an unload) is newer and is left alone this round.
    asked = eng.cache.epoch
    loaded = await m.driver.adapters(url, timeout)
    info = await m.driver.lora_info(url, timeout)
    report, now = ReconcileReport(url), m.clock()
    busy = (info.running | info.waiting) if info is not None else frozenset()
    for entry in eng.cache:
        if entry.name in busy:
            entry.busy_until = now + 2 * m.config.reconcile_interval_s * m.time_scale
            report.busy.append(entry.name)
        if eng.lock(entry.name).locked() or eng.cache.changed_since(entry.name, asked):
            continue  # a load or unload of it is under way, or done since the question
        if entry.state is State.HOT and entry.name not in loaded and entry.name not in eng.loads:
            eng.cache.set_state(entry.name, State.WARM)
            report.lost_hot.append(entry.name)
        if entry.state is State.WARM and not (eng.warm_dir / Path(entry.path).name).is_dir():
            eng.cache.drop(entry.name)
            eng.verified.discard(entry.path)
            report.lost_warm.append(entry.name)
    for name, path in loaded.items():
        known = eng.cache.entries.get(name)
        if known is not None and known.state in (State.HOT, State.LOADING):
            continue
        if eng.lock(name).locked() or eng.cache.changed_since(name, asked):
            continue  # a load or unload of it is under way, or done since; look next time
        if name in eng.loads:
            continue
        ours = known is not None and known.path == path and path in eng.verified
        if ours and eng.cache.free_hot_slots() > 0:
            eng.cache.set_state(name, State.HOT)
            report.adopted_hot.append(name)
        elif known is None and await _adopt_peer_load(m, eng, path):
            report.adopted_hot.append(name)  # another router's manager loaded it, verified
        else:
            await m.driver.unload(url, name, timeout)
            report.unloaded.append(name)
    eng.cache.forget_changes(asked)
    if any((report.lost_hot, report.adopted_hot, report.unloaded, report.lost_warm)):
        log.info("reconciled %s: %s", url, report)
    return report


async def _adopt_peer_load(m: AdapterCacheManager, eng: EngineState, path: str) -> bool:
    """Several routers may share engines and their warm directory: an adapter another manager
    loaded from that directory is adopted once it re-verifies here, never unloaded blindly."""
    if Path(path).parent != Path(eng.engine_dir):
        return False
    local = eng.warm_dir / Path(path).name
    adapter = _marked_adapter(m, local)
    if adapter is None:
        return False
    try:
        await asyncio.to_thread(m.loader.verifier.verify_for_engine, local, adapter, eng.spec)
    except VerificationError:
        return False
    eng.cache.adopt(adapter, path, State.HOT)
    eng.verified.add(path)
    return True


async def adopt_warm_dir(m: AdapterCacheManager, eng: EngineState) -> list[str]:
    """After a restart: keep warm files that re-verify against the registry, delete the rest
    (disabled or unknown versions, anything without a marker, and temp dirs a crash left).
    Files of entries already tracked, and anything while loads are under way, are left alone."""
    adopted = []
    known = {Path(e.path).name for e in eng.cache}
    for path in sorted(eng.warm_dir.iterdir()):
        if path.name.endswith(MARKER_SUFFIX) or path.name in known:
            continue
        if path.name.startswith(".") and eng.loads:  # a materialisation in progress
            continue
        adapter = _marked_adapter(m, path)
        if adapter is not None and await _adopt(m, eng, adapter, path):
            adopted.append(adapter.engine_name)
            continue
        await asyncio.to_thread(remove_warm_copy, path)
    return adopted


async def _adopt(
    m: AdapterCacheManager, eng: EngineState, adapter: AdapterVersion, path: Path
) -> bool:
    if adapter.engine_name in eng.cache.entries or eng.cache.free_warm_slots() <= 0:
        return False
    try:
        await asyncio.to_thread(m.loader.verifier.verify_for_engine, path, adapter, eng.spec)
    except VerificationError as exc:
        log.warning("warm copy %s no longer verifies: %s", path, exc)
        return False
    engine_path = f"{eng.engine_dir.rstrip('/')}/{path.name}"
    eng.cache.adopt(adapter, engine_path, State.WARM)
    eng.verified.add(engine_path)
    return True


def _marked_adapter(m: AdapterCacheManager, path: Path) -> AdapterVersion | None:
    try:
        marker = json.loads(Path(f"{path}{MARKER_SUFFIX}").read_text())
        adapter = m.resolver.version(str(marker["adapter_id"]), str(marker["version"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (
        adapter is None
        or adapter.status is Status.DISABLED
        or adapter.sha256 != marker.get("sha256")
    ):
        return None
    return adapter if path.name.startswith(f"{adapter.engine_name}-") else None


async def sweep(m: AdapterCacheManager, eng: EngineState) -> list[tuple[str, str]]:
    """One demotion step per matching entry; returns (name, rule or reason) for each."""
    done: list[tuple[str, str]] = []
    now = m.clock()
    for entry in eng.cache:
        if entry.state not in (State.HOT, State.WARM) or eng.cache.is_protected(entry, now):
            continue
        if not m.resolver.is_current(entry.adapter.adapter_id, entry.adapter.version):
            await retire(m, eng, entry)
            done.append((entry.name, "superseded"))
            continue
        facts = m.facts.of(
            entry.adapter, entry, eng.stats, now, m.home_rank(eng.spec.url, entry.adapter)
        )
        rule = None if m.rules.pinned(facts) else m.rules.should_demote(facts)
        if rule is None:
            continue
        if entry.state is State.HOT:
            eng.cache.set_state(entry.name, State.WARM)
            await m.loader.demote(eng, entry.name, "rule")
        else:
            eng.cache.drop(entry.name)
            await m.loader.drop(eng, entry, "rule", pinned=False)
        done.append((entry.name, rule))
    return done


def sync_releases(m: AdapterCacheManager) -> list[tuple[str, str]]:
    """Start the prewarms releases call for; returns (engine, adapter) for each started."""
    started: list[tuple[str, str]] = []
    for canary in _canaries(m):
        engines = _engines_for(m, canary)
        have = [e for e in engines if _hot_or_loading(e, canary.engine_name)]
        for eng in _prefer_stable_hot(m, engines, canary)[
            : max(0, m.config.canary_prewarm_engines - len(have))
        ]:
            if not _hot_or_loading(eng, canary.engine_name):
                m.prewarm_on(eng, canary)
                started.append((eng.spec.url, canary.engine_name))
    for current in m.resolver.current_versions():
        for eng in _engines_for(m, current):
            old_hot = any(
                e.adapter.adapter_id == current.adapter_id
                and e.state is State.HOT
                and e.adapter.version != current.version
                for e in eng.cache
            )
            if old_hot and not _hot_or_loading(eng, current.engine_name):
                m.prewarm_on(eng, current)
                started.append((eng.spec.url, current.engine_name))
    return started


def run_warmups(m: AdapterCacheManager) -> list[tuple[str, str]]:
    """Prewarm (to the warm tier) what scheduled warmups that just opened select, on each
    engine where the selector holds (it may use ``home_rank`` to pick a few engines)."""
    started: list[tuple[str, str]] = []
    now = m.clock()
    for rule in m.warmups.due(now):
        for adapter in m.resolver.current_versions():
            for eng in _engines_for(m, adapter):
                rank = m.home_rank(eng.spec.url, adapter)
                if rule(m.facts.of(adapter, None, eng.stats, now, rank).as_fields()):
                    m.prewarm_on(eng, adapter, to=ResidencyTier.WARM)
                    started.append((eng.spec.url, adapter.engine_name))
    return started


def _canaries(m: AdapterCacheManager) -> list[AdapterVersion]:
    out = []
    for adapter_id in {v.adapter_id for v in m.resolver.current_versions()}:
        release = m.resolver.release(adapter_id)
        if release is not None and release.canary_version is not None:
            version = m.resolver.version(adapter_id, release.canary_version)
            if version is not None:
                out.append(version)
    return out


def _engines_for(m: AdapterCacheManager, adapter: AdapterVersion) -> list[EngineState]:
    return [e for e in m.engines.values() if e.spec.base_model == adapter.base_model]


def _hot_or_loading(eng: EngineState, name: str) -> bool:
    return eng.cache.residency(name) is ResidencyTier.HOT or name in eng.loads


def _prefer_stable_hot(
    m: AdapterCacheManager, engines: list[EngineState], canary: AdapterVersion
) -> list[EngineState]:
    release = m.resolver.release(canary.adapter_id)
    stable = f"{canary.adapter_id}@{release.stable_version}" if release else ""
    return sorted(
        engines,
        key=lambda e: (
            e.cache.residency(stable) is not ResidencyTier.HOT,
            -e.cache.free_hot_slots(),
            e.spec.url,
        ),
    )


class Upkeep:
    """Runs refresh, release sync, warmups, reconciliation and sweeps periodically."""

    def __init__(self, manager: AdapterCacheManager, refresh_registry: bool = True) -> None:
        self.m = manager
        self.refresh_registry = refresh_registry
        self._task: asyncio.Task[None] | None = None
        self._last_sweep = 0.0
        self._adopted = False

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="lora-upkeep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run(self) -> None:
        while True:
            await self.once()
            await asyncio.sleep(self.m.config.reconcile_interval_s)

    async def once(self) -> None:
        m = self.m
        if self.refresh_registry:
            await m.resolver.refresh_async()
        if not self._adopted:
            self._adopted = True
            for eng in list(m.engines.values()):
                await adopt_warm_dir(m, eng)
        sync_releases(m)
        run_warmups(m)
        sweep_due = m.clock() - self._last_sweep >= m.policy_config.demote_interval_s
        for eng in list(m.engines.values()):
            try:
                await reconcile(m, eng)
                if sweep_due:
                    await sweep(m, eng)
            except LoRAError as exc:  # an engine down must not stop the others' upkeep
                _incidents.warning(
                    f"upkeep:{eng.spec.url}", "upkeep of %s failed: %s", eng.spec.url, exc
                )
        if sweep_due:
            self._last_sweep = m.clock()
