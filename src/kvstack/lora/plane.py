"""The control plane's operations, each audited: register, sign, verify, promote, canary,
rollback, disable. The CLI and the admin API are thin shells over :class:`ControlPlane`.

Registration is the only way an adapter enters the system: the source must be on the allowlist,
its files are checked (format, shapes against the base model, no pickle), and the verified files
go to the content-addressed store; the registry records the digest that every later load must
match. Tenants never pass paths: requests name adapters, and the manager loads from the store.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kvstack.errors import LoRAError, VerificationError
from kvstack.lora.adapters import AdapterVersion, Release, check_name
from kvstack.lora.audit import AuditEntry, AuditLog
from kvstack.lora.config import AdapterEngineSpec, LoRAConfig
from kvstack.lora.registry import AdapterRegistry
from kvstack.lora.signing import sign
from kvstack.lora.store import ArtifactStore, fetch_source, open_store
from kvstack.lora.verify import Verifier

__all__ = ["ControlPlane"]

T = TypeVar("T")


class ControlPlane:
    def __init__(
        self,
        config: LoRAConfig,
        registry: AdapterRegistry,
        store: ArtifactStore,
        verifier: Verifier,
        audit: AuditLog,
    ) -> None:
        self.config = config
        self.registry = registry
        self.store = store
        self.verifier = verifier
        self.audit = audit

    @classmethod
    def from_config(cls, config: LoRAConfig) -> ControlPlane:
        return cls(
            config,
            AdapterRegistry(config.registry_url),
            open_store(config.artifact_store, config.s3_endpoint_url),
            Verifier.from_config(config),
            AuditLog(config.registry_url),
        )

    def register(
        self,
        source: str,
        adapter_id: str,
        version: str,
        base_model: str,
        tenant_id: str,
        priority_tier: str,
        actor: str,
        activate_first: bool = True,
        base_model_revision: str = "",
        tokenizer_revision: str = "",
    ) -> AdapterVersion:
        """Check, store and record a new adapter version; raises with the reason on rejection."""

        def work() -> AdapterVersion:
            check_name(adapter_id, "adapter id")
            check_name(version, "version")
            if priority_tier not in self.config.priority_weights:
                known = sorted(self.config.priority_weights)
                raise LoRAError(f"priority tier {priority_tier!r} is unknown; known: {known}")
            self.verifier.check_source(source)
            with tempfile.TemporaryDirectory(prefix="kvstack-register-") as tmp:
                fetch_source(
                    source, Path(tmp), self.config.max_adapter_bytes, self.config.s3_endpoint_url
                )
                inspection = self.verifier.inspect_source(Path(tmp), base_model)
                ref = self.store.put(Path(tmp), inspection.manifest)
            record = AdapterVersion(
                adapter_id=adapter_id,
                version=version,
                base_model=base_model,
                rank=inspection.info.rank,
                alpha=inspection.info.alpha,
                artifact_uri=ref.uri,
                sha256=ref.sha256,
                size_bytes=ref.size_bytes,
                tenant_id=tenant_id,
                priority_tier=priority_tier,
                target_modules=inspection.info.target_modules,
                base_model_revision=base_model_revision,
                tokenizer_revision=tokenizer_revision,
                created_at=time.time(),
                source_uri=source,
            )
            return self.registry.add(record, activate_first=activate_first)

        return self._audited("register", actor, adapter_id, version, work, lambda v: v.sha256)

    def sign(self, adapter_id: str, version: str, key_path: Path, actor: str) -> AdapterVersion:
        def work() -> AdapterVersion:
            adapter = self.registry.get(adapter_id, version)
            signature = sign(key_path, adapter)
            self.registry.set_signature(adapter_id, version, signature.value, signature.signer)
            return self.registry.get(adapter_id, version)

        return self._audited("sign", actor, adapter_id, version, work, lambda v: v.sha256)

    def verify(
        self, adapter_id: str, version: str, actor: str, engine: AdapterEngineSpec | None = None
    ) -> AdapterVersion:
        """Fetch the stored artifact and run every load-time check (for one engine if given)."""
        return self._audited(
            "verify",
            actor,
            adapter_id,
            version,
            lambda: self._check(adapter_id, version, engine),
            lambda v: v.sha256,
        )

    def promote(self, adapter_id: str, version: str, actor: str, force: bool = False) -> Release:
        """Make ``version`` stable once it verifies (digest, signature, compatibility with
        every configured engine of its base model); ``force`` skips that, and only exists
        while no signing key is trusted (see :meth:`_trusted_before_release`)."""

        def work() -> Release:
            self._trusted_before_release(adapter_id, version, force)
            return self.registry.promote(adapter_id, version)

        return self._audited("promote", actor, adapter_id, version, work, note=_forced(force))

    def canary(
        self, adapter_id: str, version: str, percent: float, actor: str, force: bool = False
    ) -> Release:
        """Send ``percent`` % of the traffic to ``version`` once it verifies (as promote)."""

        def work() -> Release:
            self._trusted_before_release(adapter_id, version, force)
            return self.registry.canary(adapter_id, version, percent)

        note = f"{percent}%" + (f"; {_forced(force)}" if force else "")
        return self._audited("canary", actor, adapter_id, version, work, note=note)

    def _trusted_before_release(self, adapter_id: str, version: str, force: bool) -> None:
        """Refuse to release a version that does not verify. ``force`` is accepted only when
        ``lora.trusted_keys`` is empty: with a signing key configured, the only way to
        release is to sign."""
        if not force:
            self._check(adapter_id, version, None)
            return
        if self.config.trusted_keys:
            raise LoRAError(
                "--force is refused while lora.trusted_keys is configured: sign the version "
                f"(kvstack adapters sign {adapter_id}@{version} --key KEY) and release it then"
            )

    def _check(
        self, adapter_id: str, version: str, engine: AdapterEngineSpec | None
    ) -> AdapterVersion:
        """Every load-time check of the stored artifact: digest, signature, files, shapes
        against the base model (its revision included), then compatibility with ``engine``,
        or else with at least one configured engine of its base model (a fleet may mix
        engines of different LoRA ranks)."""
        adapter = self.registry.get(adapter_id, version)
        with tempfile.TemporaryDirectory(prefix="kvstack-verify-") as tmp:
            self.store.fetch(adapter.artifact_uri, Path(tmp), self.config.max_adapter_bytes)
            self.verifier.verify_for_engine(Path(tmp), adapter, engine or _engine_for(adapter))
        if engine is None:
            self._check_some_engine(adapter)
        return adapter

    def _check_some_engine(self, adapter: AdapterVersion) -> None:
        engines = [e for e in self.config.engines if e.base_model == adapter.base_model]
        failures: list[VerificationError] = []
        for spec in engines:
            try:
                self.verifier.check_compatible(adapter, spec)
                return
            except VerificationError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def rollback(self, adapter_id: str, actor: str) -> Release:
        return self._audited(
            "rollback", actor, adapter_id, "", lambda: self.registry.rollback(adapter_id)
        )

    def disable(self, adapter_id: str, version: str, actor: str) -> Release:
        return self._audited(
            "disable",
            actor,
            adapter_id,
            version,
            lambda: self.registry.disable(adapter_id, version),
        )

    def _audited(
        self,
        action: str,
        actor: str,
        adapter_id: str,
        version: str,
        work: Callable[[], T],
        digest_of: Callable[[T], str] | None = None,
        note: str = "",
    ) -> T:
        start = time.perf_counter()
        try:
            result = work()
        except LoRAError as exc:
            reason = (
                str(exc) if isinstance(exc, VerificationError) else f"{type(exc).__name__}: {exc}"
            )
            self.audit.record(
                AuditEntry(
                    actor, action, adapter_id, version, "reject", reason, latency_ms=_ms(start)
                )
            )
            raise
        digest = digest_of(result) if digest_of else ""
        self.audit.record(
            AuditEntry(
                actor, action, adapter_id, version, "accept", note, digest, latency_ms=_ms(start)
            )
        )
        return result


def _forced(force: bool) -> str:
    return "forced: released without verification" if force else ""


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


def _engine_for(adapter: AdapterVersion) -> AdapterEngineSpec:
    """A stand-in engine that serves the adapter's base model with any rank (verify without one)."""
    return AdapterEngineSpec(
        url="http://verify.invalid",
        base_model=adapter.base_model,
        served_model_name=adapter.base_model,
        warm_dir="/nonexistent",
        max_lora_rank=max(adapter.rank, 1),
    )
