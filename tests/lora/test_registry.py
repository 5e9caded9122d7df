"""Registry narratives on SQLite and PostgreSQL: register, canary, promote, rollback, disable;
the resolver's view of them; the append-only audit table."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import sqlalchemy as sa

from kvstack.errors import RegistryError
from kvstack.lora.adapters import AdapterVersion, Status
from kvstack.lora.audit import AuditEntry, AuditLog
from kvstack.lora.config import LoRAConfig
from kvstack.lora.registry import AdapterRegistry
from kvstack.lora.resolver import Resolver


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def registry_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'r.db'}"
    url: str = request.getfixturevalue("postgres_url")
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # each test starts from empty tables
        conn.exec_driver_sql("DROP TABLE IF EXISTS lora_adapter_versions, lora_releases")
    engine.dispose()
    from kvstack.lora import db

    db._engines.pop(url, None)
    return url


def version(v: str, adapter_id: str = "acme-support") -> AdapterVersion:
    return AdapterVersion(
        adapter_id=adapter_id,
        version=v,
        base_model="toy",
        rank=8,
        alpha=16.0,
        artifact_uri=f"file:///store/{'a' * 64}",
        sha256="a" * 64,
        size_bytes=1000,
        tenant_id="acme",
        priority_tier="gold",
        target_modules=("q_proj", "v_proj"),
        created_at=time.time(),
    )


def test_release_lifecycle(registry_url: str) -> None:
    reg = AdapterRegistry(registry_url)
    resolver = Resolver(reg, LoRAConfig(registry_url=registry_url))
    assert reg.add(version("1")).status is Status.ACTIVE
    assert reg.add(version("2")).status is Status.STAGED
    with pytest.raises(RegistryError, match="already registered"):
        reg.add(version("2"))
    resolver.refresh()
    assert resolver.resolve("acme-support", "u1").engine_name == "acme-support@1"
    assert resolver.resolve("unknown-model") is None

    reg.canary("acme-support", "2", 30.0)
    resolver.refresh()
    sides = Counter(
        resolver.resolve("acme-support", f"user-{i}").adapter.version for i in range(2000)
    )
    assert 500 < sides["2"] < 700  # ~30 % of keys, deterministic per key
    assert resolver.resolve("acme-support", "user-7") == resolver.resolve("acme-support", "user-7")

    release = reg.promote("acme-support", "2")
    assert (release.stable_version, release.rollback_to, release.canary_version) == ("2", "1", None)
    assert reg.get("acme-support", "1").status is Status.DEPRECATED
    resolver.refresh()
    assert resolver.resolve("acme-support").engine_name == "acme-support@2"
    assert resolver.resolve("acme-support@1").engine_name == "acme-support@1"  # pinned

    release = reg.rollback("acme-support")  # one command back to 1
    assert (release.stable_version, release.rollback_to) == ("1", None)
    assert reg.get("acme-support", "2").status is Status.STAGED
    with pytest.raises(RegistryError, match="no canary and no version"):
        reg.rollback("acme-support")

    reg.canary("acme-support", "2", 50.0)
    assert reg.rollback("acme-support").canary_version is None  # rollback ends a canary first

    reg.disable("acme-support", "2")
    resolver.refresh()
    with pytest.raises(RegistryError, match="disabled"):
        resolver.resolve("acme-support@2")
    with pytest.raises(RegistryError, match="disabled"):
        reg.promote("acme-support", "2")
    reg.disable("acme-support", "1")
    resolver.refresh()
    with pytest.raises(RegistryError, match="no active version"):
        resolver.resolve("acme-support")


def test_revert_takes_a_failing_release_out_of_service_once(registry_url: str) -> None:
    reg = AdapterRegistry(registry_url)
    for v in ("1", "2", "3"):
        reg.add(version(v))
    assert reg.revert("acme-support", "1") is None  # stable, nothing to go back to: kept
    reg.promote("acme-support", "2")
    reg.canary("acme-support", "3", 20.0)
    ended = reg.revert("acme-support", "3")  # a failing canary is ended
    assert ended is not None and (ended.canary_version, ended.stable_version) == (None, "2")
    assert reg.get("acme-support", "3").status is Status.STAGED
    back = reg.revert("acme-support", "2")  # a failing stable version gives way
    assert back is not None and (back.stable_version, back.rollback_to) == ("1", None)
    assert reg.get("acme-support", "1").status is Status.ACTIVE
    assert reg.get("acme-support", "2").status is Status.STAGED
    assert reg.revert("acme-support", "2") is None  # a second router finds it done
    assert reg.revert("unknown", "1") is None


def test_bad_names_and_percent(registry_url: str) -> None:
    reg = AdapterRegistry(registry_url)
    for bad in ("../x", "a b", "a@b", "", "a/b"):
        with pytest.raises(RegistryError, match="invalid"):
            reg.add(version(bad))
    reg.add(version("1"))
    reg.add(version("2"))
    with pytest.raises(RegistryError, match="out of range"):
        reg.canary("acme-support", "2", 150)
    with pytest.raises(RegistryError, match="unknown adapter version"):
        reg.promote("acme-support", "9")


def test_audit_log_is_append_only(registry_url: str) -> None:
    audit = AuditLog(registry_url)
    stored = audit.record(AuditEntry("cli:alice", "promote", "a", "1", "accept", latency_ms=1.5))
    assert stored.id > 0 and stored.ts > 0
    assert audit.entries(adapter_id="a")[0] == stored
    engine = sa.create_engine(registry_url)
    for statement in (
        "UPDATE lora_audit_log SET decision = 'reject'",
        "DELETE FROM lora_audit_log",
    ):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.exec_driver_sql(statement)
    engine.dispose()
    assert audit.entries(adapter_id="a")[0].decision == "accept"
