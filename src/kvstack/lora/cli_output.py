"""What ``kvstack adapters`` prints: each verb's :class:`Shown` (text lines for people, one JSON
document with ``--json``), and the shared rows: versions, releases and audit entries with their
times as ISO-8601 (:func:`kvstack.output.iso_time`) in both forms."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvstack.lora.adapters import AdapterVersion, Release
from kvstack.lora.audit import AuditEntry
from kvstack.output import iso_time

__all__ = [
    "Shown",
    "audit_lines",
    "audit_row",
    "release_line",
    "release_row",
    "version_row",
    "version_table",
]


@dataclass(frozen=True, slots=True)
class Shown:
    """A verb's result: ``text`` (printed by default) and ``data`` (printed by ``--json``)."""

    text: str
    data: Any


def version_row(v: AdapterVersion) -> dict[str, Any]:
    row = asdict(v)
    row.update(
        engine_name=v.engine_name,
        status=v.status.value,
        target_modules=list(v.target_modules),
        created_at=iso_time(v.created_at),
    )
    return row


def release_row(r: Release) -> dict[str, Any]:
    return {**asdict(r), "updated_at": iso_time(r.updated_at)}


def audit_row(e: AuditEntry) -> dict[str, Any]:
    return {**asdict(e), "ts": iso_time(e.ts)}


def version_table(versions: list[AdapterVersion]) -> str:
    header = f"{'ADAPTER@VERSION':<40} {'STATUS':<10} {'TENANT':<16} {'TIER':<10} {'RANK':>4}"
    lines = [f"{header}  SIGNED  {'CREATED':<24}"]
    for v in versions:
        signed = "yes" if v.signature else "no"
        lines.append(
            f"{v.engine_name:<40} {v.status.value:<10} {v.tenant_id:<16} {v.priority_tier:<10} "
            f"{v.rank:>4}  {signed:<6}  {iso_time(v.created_at)}"
        )
    return "\n".join(lines)


def release_line(r: Release) -> str:
    """``support: stable v1, canary v2 at 10%, rollback to v0 (updated 2026-...Z)``."""
    parts = [f"stable {r.stable_version or 'none'}"]
    if r.canary_version:
        parts.append(f"canary {r.canary_version} at {r.canary_percent:g}%")
    if r.rollback_to:
        parts.append(f"rollback to {r.rollback_to}")
    return f"{r.adapter_id}: {', '.join(parts)} (updated {iso_time(r.updated_at)})"


def audit_lines(entries: list[AuditEntry]) -> str:
    return "\n".join(
        f"{iso_time(e.ts)} {e.actor:<20} {e.action:<9} {e.adapter_id}@{e.version:<8} "
        f"{e.decision:<7} {e.latency_ms:8.1f}ms {e.reason}"
        for e in entries
    )
