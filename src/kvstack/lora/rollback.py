"""Automatic rollback: a released version that fails verification at load leaves service.

Verification runs before every load (:meth:`kvstack.lora.verify.Verifier.verify_for_engine`),
so a stable version whose stored files were altered, whose signature no longer verifies, or
whose base-model revision no longer matches is never loaded. Without this module every request
for it would then fall back to the base model (or be refused). Instead, the load task that
saw the failure calls :meth:`AutoRollback.take_out` once:

1. the registry reverts the release (:meth:`kvstack.lora.registry.AdapterRegistry.revert`): a
   failing canary is ended, a failing stable version gives way to its ``rollback_to``;
2. the change is audited (``auto_rollback``, actor ``manager``), counted in
   ``kvstack_lora_auto_rollbacks_total{adapter,reason}`` and logged at ERROR;
3. the resolver's snapshot is refreshed, so new requests resolve to the version now stable.

Requests already waiting for the failed load are then served by that version
(:meth:`AutoRollback.replacement`), except requests that pinned the failed version by name:
they asked for exactly that one. A failure that is a property of one engine rather than of the
artifact (a rank above that engine's maximum) reverts nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kvstack.errors import VerificationError
from kvstack.lora.adapters import AdapterVersion
from kvstack.lora.audit import AuditEntry, AuditLog
from kvstack.lora.metrics import LoRAMetrics
from kvstack.lora.resolver import Resolver

__all__ = ["ENGINE_SPECIFIC_REASONS", "AutoRollback"]

log = logging.getLogger(__name__)

# Verification failures that say "not on this engine", not "this artifact is bad".
ENGINE_SPECIFIC_REASONS = frozenset({"rank_exceeds_engine"})


class AutoRollback:
    def __init__(
        self,
        resolver: Resolver,
        audit: AuditLog | None,
        metrics: LoRAMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.resolver = resolver
        self.audit = audit
        self.metrics = metrics
        self.clock = clock

    async def take_out(
        self, adapter: AdapterVersion, exc: VerificationError, engine_url: str
    ) -> bool:
        """Revert ``adapter``'s release after ``exc`` at a load on ``engine_url``; True when
        this call changed the release (another router may have done it first)."""
        registry = self.resolver.registry
        if exc.reason in ENGINE_SPECIFIC_REASONS or registry is None:
            return False
        start = self.clock()
        release = await asyncio.to_thread(registry.revert, adapter.adapter_id, adapter.version)
        if release is not None:
            now = release.stable_version or "none"
            log.error(
                "adapter %s failed verification at load on %s (%s): taken out of service, "
                "%s is stable now",
                adapter.engine_name,
                engine_url,
                exc,
                now,
            )
            self.metrics.auto_rollback(adapter.adapter_id, exc.reason)
            await self._audit(adapter, exc, engine_url, now, start)
        await self.resolver.refresh_async()
        return release is not None

    def replacement(self, adapter: AdapterVersion) -> AdapterVersion | None:
        """The version serving instead of ``adapter`` once it left service, or None while it
        is still stable or canary (nothing was reverted) or nothing else is stable."""
        if self.resolver.is_current(adapter.adapter_id, adapter.version):
            return None
        release = self.resolver.release(adapter.adapter_id)
        if release is None or release.stable_version is None:
            return None
        return self.resolver.version(adapter.adapter_id, release.stable_version)

    async def _audit(
        self,
        adapter: AdapterVersion,
        exc: VerificationError,
        engine_url: str,
        now_stable: str,
        start: float,
    ) -> None:
        if self.audit is None:
            return
        entry = AuditEntry(
            "manager",
            "auto_rollback",
            adapter.adapter_id,
            adapter.version,
            "done",
            f"failed verification at load ({exc}); stable is now {now_stable}",
            adapter.sha256,
            (self.clock() - start) * 1000.0,
            engine_url,
        )
        await self.audit.record_async(entry)
