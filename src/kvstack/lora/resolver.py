"""Resolve a client's model name to an adapter version, from an in-memory registry snapshot.

The router calls :meth:`Resolver.resolve` on every request, so it never touches the database:
a background task (or the admin API after a change) calls :meth:`Resolver.refresh_async`,
which reads the registry in a worker thread and swaps the snapshot in one assignment.

``resolve("tenant-a-support", routing_key)`` picks the stable version, or the canary version
for ``canary_percent`` % of routing keys (the same key always lands on the same side, so one
user's conversation does not flip between versions). ``resolve("tenant-a-support@v3")`` pins a
version explicitly (any status but disabled). A name that is not a registered adapter returns
None: the router treats it as a base model or an unknown model.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass

from kvstack.errors import RegistryError
from kvstack.lora.adapters import AdapterVersion, Release, Status, split_engine_name
from kvstack.lora.config import LoRAConfig
from kvstack.lora.registry import AdapterRegistry, RegistrySnapshot

__all__ = ["AdapterResolution", "Resolver"]


@dataclass(frozen=True, slots=True)
class AdapterResolution:
    model: str  # the name the client asked for
    adapter: AdapterVersion
    is_canary: bool
    allow_base_fallback: bool  # the tenant accepts the base model when the adapter is cold

    @property
    def engine_name(self) -> str:
        """The ``model`` to send to the engine: ``adapter_id@version``."""
        return self.adapter.engine_name

    @property
    def tenant_id(self) -> str:
        return self.adapter.tenant_id

    @property
    def priority_tier(self) -> str:
        return self.adapter.priority_tier

    @property
    def base_model(self) -> str:
        return self.adapter.base_model


class Resolver:
    def __init__(self, registry: AdapterRegistry | None, config: LoRAConfig) -> None:
        self.registry = registry
        self.config = config
        self._releases: dict[str, Release] = {}
        self._versions: dict[tuple[str, str], AdapterVersion] = {}

    def load_snapshot(self, snapshot: RegistrySnapshot) -> None:
        self._releases, self._versions = snapshot

    def refresh(self) -> None:
        """Re-read the registry (blocking)."""
        if self.registry is not None:
            self.load_snapshot(self.registry.snapshot())

    async def refresh_async(self) -> None:
        if self.registry is not None:
            self.load_snapshot(await asyncio.to_thread(self.registry.snapshot))

    async def run_refresh(self, interval_s: float) -> None:
        """Refresh forever (run as a task; cancel to stop)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.refresh_async()

    def resolve(self, model: str, routing_key: str | None = None) -> AdapterResolution | None:
        pinned = split_engine_name(model)
        if pinned is not None:
            return self._pinned(model, *pinned)
        release = self._releases.get(model)
        if release is None:
            return None
        version = release.stable_version
        is_canary = release.canary_version is not None and _in_canary(
            model, routing_key, release.canary_percent
        )
        if is_canary:
            version = release.canary_version
        if version is None:
            raise RegistryError(f"adapter {model!r} has no active version")
        return self._resolution(model, self._versions[(model, version)], is_canary)

    def _pinned(self, model: str, adapter_id: str, version: str) -> AdapterResolution | None:
        adapter = self._versions.get((adapter_id, version))
        if adapter is None:
            if adapter_id in self._releases:
                raise RegistryError(f"unknown version {version!r} of adapter {adapter_id!r}")
            return None
        if adapter.status is Status.DISABLED:
            raise RegistryError(f"{model} is disabled")
        return self._resolution(model, adapter, adapter.status is Status.CANARY)

    def _resolution(
        self, model: str, adapter: AdapterVersion, is_canary: bool
    ) -> AdapterResolution:
        tenant = self.config.tenant(adapter.tenant_id)
        return AdapterResolution(model, adapter, is_canary, tenant.allow_base_fallback)

    # -- what the cache manager asks ------------------------------------------------------

    def version(self, adapter_id: str, version: str) -> AdapterVersion | None:
        return self._versions.get((adapter_id, version))

    def release(self, adapter_id: str) -> Release | None:
        return self._releases.get(adapter_id)

    def is_current(self, adapter_id: str, version: str) -> bool:
        """Whether new requests may still be routed to this version (stable or canary)."""
        release = self._releases.get(adapter_id)
        return release is not None and version in (release.stable_version, release.canary_version)

    def canary_versions(self) -> list[AdapterVersion]:
        return [
            self._versions[(r.adapter_id, r.canary_version)]
            for r in self._releases.values()
            if r.canary_version is not None and r.canary_percent > 0
        ]

    def current_versions(self) -> list[AdapterVersion]:
        return [
            self._versions[(r.adapter_id, v)]
            for r in self._releases.values()
            for v in (r.stable_version, r.canary_version)
            if v is not None
        ]


def _in_canary(adapter_id: str, routing_key: str | None, percent: float) -> bool:
    if percent <= 0:
        return False
    if routing_key is None:
        return random.random() * 100.0 < percent
    digest = hashlib.blake2b(f"{adapter_id}\x00{routing_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 10_000 < percent * 100.0
