"""The append-only audit log: every registry change and every load decision, with its reason.

Writes go to the registry's database (the table refuses UPDATE and DELETE, see
:mod:`kvstack.lora.db`). ``record`` is blocking; async callers use ``record_async``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

import sqlalchemy as sa

from kvstack.lora.db import audit_log, open_database

__all__ = ["AuditEntry", "AuditLog"]


@dataclass(frozen=True, slots=True)
class AuditEntry:
    actor: str  # "cli:alice", "admin-api", "manager"
    action: str  # register, sign, verify, load, promote, canary, rollback, disable, evict, ...
    adapter_id: str
    version: str
    decision: str  # accept, reject, done
    reason: str = ""
    digest: str = ""
    latency_ms: float = 0.0
    engine: str = ""
    ts: float = 0.0
    id: int = 0


class AuditLog:
    def __init__(self, url: str) -> None:
        self._engine = open_database(url)

    def record(self, entry: AuditEntry) -> AuditEntry:
        """Append ``entry`` (its ``ts`` set to now when 0) and return it as stored."""
        row = asdict(entry)
        row.pop("id")
        row["ts"] = row["ts"] or time.time()
        row["reason"] = row["reason"][:1024]
        with self._engine.begin() as conn:
            result = conn.execute(sa.insert(audit_log).values(**row))
            new_id = result.inserted_primary_key[0] if result.inserted_primary_key else 0
        return AuditEntry(**{**row, "id": int(new_id)})

    async def record_async(self, entry: AuditEntry) -> AuditEntry:
        return await asyncio.to_thread(self.record, entry)

    def entries(
        self,
        adapter_id: str | None = None,
        action: str | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The newest ``limit`` entries, newest first."""
        query = sa.select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
        if adapter_id is not None:
            query = query.where(audit_log.c.adapter_id == adapter_id)
        if action is not None:
            query = query.where(audit_log.c.action == action)
        with self._engine.connect() as conn:
            return [AuditEntry(**row._asdict()) for row in conn.execute(query)]
