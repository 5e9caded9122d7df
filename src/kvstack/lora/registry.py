"""The adapter registry: versions, their status, and each adapter's release state.

Every method is one transaction; the release row is locked (``SELECT … FOR UPDATE`` on
PostgreSQL) while a release changes, so two routers promoting at once serialise. The registry
holds metadata only: weights live in the artifact store, addressed by the recorded digest.

Release transitions (``stable`` / ``canary`` are versions, ``rollback_to`` where rollback goes):

- ``promote(v)``: v becomes stable (active), the old stable becomes deprecated and rollback_to.
- ``canary(v, p)``: v takes p % of the traffic; a previous canary goes back to staged.
- ``rollback()``: ends a canary if there is one, else makes rollback_to stable again.
- ``disable(v)``: v is never served again; if it was stable the adapter has no stable version.
- ``revert(v)``: v, released but failing verification at load, leaves service: a canary v is
  ended; a stable v gives way to rollback_to (v is staged, so only a new promote, which
  verifies, can bring it back).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from kvstack.errors import RegistryError
from kvstack.lora.adapters import AdapterVersion, Release, Status, check_name
from kvstack.lora.db import adapter_versions, open_database, releases

__all__ = ["AdapterRegistry", "RegistrySnapshot"]

RegistrySnapshot = tuple[dict[str, Release], dict[tuple[str, str], AdapterVersion]]


class AdapterRegistry:
    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = open_database(url)

    # -- writes ---------------------------------------------------------------------------

    def add(self, version: AdapterVersion, activate_first: bool = True) -> AdapterVersion:
        """Insert a new version; the first version of an adapter becomes stable if asked."""
        check_name(version.adapter_id, "adapter id")
        check_name(version.version, "version")
        with self._engine.begin() as conn:
            if self._get(conn, version.adapter_id, version.version) is not None:
                raise RegistryError(f"{version.engine_name} is already registered")
            release = self._release_for_update(conn, version.adapter_id)
            first = release is None or release.stable_version is None
            status = Status.ACTIVE if first and activate_first else Status.STAGED
            stored = version.with_status(status)
            conn.execute(sa.insert(adapter_versions).values(**_to_row(stored)))
            if release is None:
                conn.execute(
                    sa.insert(releases).values(
                        adapter_id=version.adapter_id, updated_at=time.time()
                    )
                )
            if status is Status.ACTIVE:
                self._set_release(conn, version.adapter_id, stable_version=version.version)
        return stored

    def set_signature(self, adapter_id: str, version: str, signature: str, signer: str) -> None:
        with self._engine.begin() as conn:
            self._require(conn, adapter_id, version)
            conn.execute(
                sa.update(adapter_versions)
                .where(_key(adapter_id, version))
                .values(signature=signature, signer=signer)
            )

    def promote(self, adapter_id: str, version: str) -> Release:
        with self._engine.begin() as conn:
            target = self._servable(conn, adapter_id, version)
            release = self._release_for_update(conn, adapter_id) or Release(adapter_id)
            old = release.stable_version
            if old == target.version:
                return release
            if old is not None:
                self._set_status(conn, adapter_id, old, Status.DEPRECATED)
            self._set_status(conn, adapter_id, version, Status.ACTIVE)
            canary = release.canary_version if release.canary_version != version else None
            return self._set_release(
                conn,
                adapter_id,
                stable_version=version,
                rollback_to=old,
                canary_version=canary,
                canary_percent=release.canary_percent if canary else 0.0,
            )

    def canary(self, adapter_id: str, version: str, percent: float) -> Release:
        if not 0.0 <= percent <= 100.0:
            raise RegistryError(f"canary percent {percent} is out of range 0-100")
        with self._engine.begin() as conn:
            self._servable(conn, adapter_id, version)
            release = self._release_for_update(conn, adapter_id) or Release(adapter_id)
            if release.stable_version == version:
                raise RegistryError(f"{adapter_id}@{version} is already the stable version")
            if release.canary_version not in (None, version):
                self._set_status(conn, adapter_id, release.canary_version, Status.STAGED)
            self._set_status(conn, adapter_id, version, Status.CANARY)
            return self._set_release(
                conn, adapter_id, canary_version=version, canary_percent=percent
            )

    def rollback(self, adapter_id: str) -> Release:
        with self._engine.begin() as conn:
            release = self._release_for_update(conn, adapter_id)
            if release is None:
                raise RegistryError(f"unknown adapter {adapter_id!r}")
            if release.canary_version is not None:
                self._set_status(conn, adapter_id, release.canary_version, Status.STAGED)
                return self._set_release(conn, adapter_id, canary_version=None, canary_percent=0.0)
            back = release.rollback_to
            if back is None:
                raise RegistryError(f"{adapter_id} has no canary and no version to roll back to")
            self._servable(conn, adapter_id, back)
            if release.stable_version is not None:
                self._set_status(conn, adapter_id, release.stable_version, Status.STAGED)
            self._set_status(conn, adapter_id, back, Status.ACTIVE)
            return self._set_release(conn, adapter_id, stable_version=back, rollback_to=None)

    def revert(self, adapter_id: str, failed: str) -> Release | None:
        """Take ``failed`` out of service (see the module doc); the new release, or None when
        ``failed`` is neither canary nor stable now, or is stable with nothing to go back to
        (then nothing changes). Idempotent: a second router seeing the same failure finds the
        release already changed and gets None."""
        with self._engine.begin() as conn:
            release = self._release_for_update(conn, adapter_id)
            if release is None:
                return None
            if release.canary_version == failed:
                self._set_status(conn, adapter_id, failed, Status.STAGED)
                return self._set_release(conn, adapter_id, canary_version=None, canary_percent=0.0)
            back = release.rollback_to
            if release.stable_version != failed or back is None:
                return None
            target = self._get(conn, adapter_id, back)
            if target is None or target.status is Status.DISABLED:
                return None
            self._set_status(conn, adapter_id, failed, Status.STAGED)
            self._set_status(conn, adapter_id, back, Status.ACTIVE)
            return self._set_release(conn, adapter_id, stable_version=back, rollback_to=None)

    def disable(self, adapter_id: str, version: str) -> Release:
        with self._engine.begin() as conn:
            self._require(conn, adapter_id, version)
            release = self._release_for_update(conn, adapter_id) or Release(adapter_id)
            self._set_status(conn, adapter_id, version, Status.DISABLED)
            changes: dict[str, Any] = {}
            if release.stable_version == version:
                changes["stable_version"] = None
            if release.canary_version == version:
                changes.update(canary_version=None, canary_percent=0.0)
            if release.rollback_to == version:
                changes["rollback_to"] = None
            return self._set_release(conn, adapter_id, **changes)

    # -- reads ----------------------------------------------------------------------------

    def get(self, adapter_id: str, version: str) -> AdapterVersion:
        with self._engine.connect() as conn:
            return self._require(conn, adapter_id, version)

    def versions(self, adapter_id: str) -> list[AdapterVersion]:
        query = sa.select(adapter_versions).where(adapter_versions.c.adapter_id == adapter_id)
        with self._engine.connect() as conn:
            rows = conn.execute(query.order_by(adapter_versions.c.created_at))
            return [_from_row(r._asdict()) for r in rows]

    def release(self, adapter_id: str) -> Release | None:
        with self._engine.connect() as conn:
            row = conn.execute(
                sa.select(releases).where(releases.c.adapter_id == adapter_id)
            ).first()
        return Release(**row._asdict()) if row else None

    def snapshot(self) -> RegistrySnapshot:
        """Every release and version, read in one transaction (the resolver's view)."""
        with self._engine.connect() as conn:
            rels = {r.adapter_id: Release(**r._asdict()) for r in conn.execute(sa.select(releases))}
            vers = [_from_row(r._asdict()) for r in conn.execute(sa.select(adapter_versions))]
        return rels, {(v.adapter_id, v.version): v for v in vers}

    def list_adapters(self, tenant_id: str | None = None) -> list[AdapterVersion]:
        query = sa.select(adapter_versions).order_by(
            adapter_versions.c.adapter_id, adapter_versions.c.created_at
        )
        if tenant_id is not None:
            query = query.where(adapter_versions.c.tenant_id == tenant_id)
        with self._engine.connect() as conn:
            return [_from_row(r._asdict()) for r in conn.execute(query)]

    # -- helpers --------------------------------------------------------------------------

    def _get(self, conn: sa.Connection, adapter_id: str, version: str) -> AdapterVersion | None:
        row = conn.execute(sa.select(adapter_versions).where(_key(adapter_id, version))).first()
        return _from_row(row._asdict()) if row else None

    def _require(self, conn: sa.Connection, adapter_id: str, version: str) -> AdapterVersion:
        found = self._get(conn, adapter_id, version)
        if found is None:
            raise RegistryError(f"unknown adapter version {adapter_id}@{version}")
        return found

    def _servable(self, conn: sa.Connection, adapter_id: str, version: str) -> AdapterVersion:
        found = self._require(conn, adapter_id, version)
        if found.status is Status.DISABLED:
            raise RegistryError(f"{adapter_id}@{version} is disabled; register a new version")
        return found

    def _release_for_update(self, conn: sa.Connection, adapter_id: str) -> Release | None:
        query = sa.select(releases).where(releases.c.adapter_id == adapter_id).with_for_update()
        row = conn.execute(query).first()
        return Release(**row._asdict()) if row else None

    def _set_status(self, conn: sa.Connection, adapter_id: str, version: str, s: Status) -> None:
        conn.execute(
            sa.update(adapter_versions).where(_key(adapter_id, version)).values(status=s.value)
        )

    def _set_release(self, conn: sa.Connection, adapter_id: str, **values: Any) -> Release:
        conn.execute(
            sa.update(releases)
            .where(releases.c.adapter_id == adapter_id)
            .values(updated_at=time.time(), **values)
        )
        row = conn.execute(sa.select(releases).where(releases.c.adapter_id == adapter_id)).one()
        return Release(**row._asdict())


def _key(adapter_id: str, version: str) -> sa.ColumnElement[bool]:
    return sa.and_(
        adapter_versions.c.adapter_id == adapter_id, adapter_versions.c.version == version
    )


def _to_row(v: AdapterVersion) -> dict[str, Any]:
    row = {name: getattr(v, name) for name in AdapterVersion.__slots__}
    row["status"] = v.status.value
    row["target_modules"] = ",".join(v.target_modules)
    row["created_at"] = v.created_at or time.time()
    return row


def _from_row(row: dict[str, Any]) -> AdapterVersion:
    modules: Sequence[str] = [m for m in row.pop("target_modules").split(",") if m]
    return AdapterVersion(
        **{**row, "status": Status(row["status"]), "target_modules": tuple(modules)}
    )
