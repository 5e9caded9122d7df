"""The registry's tables (SQLAlchemy Core) and how a database URL becomes an engine.

SQLite is the default (one file, no server); ``postgresql+psycopg://…`` lets several routers
share one registry. The audit table is append-only in the database itself: triggers refuse
UPDATE and DELETE on both backends, so no code path (ours or an operator's SQL) rewrites history.
"""

from __future__ import annotations

import threading
from pathlib import Path

from kvstack.errors import require

require("sqlalchemy", "lora")

import sqlalchemy as sa  # noqa: E402

__all__ = ["METADATA", "adapter_versions", "audit_log", "open_database", "releases"]

METADATA = sa.MetaData()

adapter_versions = sa.Table(
    "lora_adapter_versions",
    METADATA,
    sa.Column("adapter_id", sa.String(128), primary_key=True),
    sa.Column("version", sa.String(128), primary_key=True),
    sa.Column("base_model", sa.String(256), nullable=False),
    sa.Column("base_model_revision", sa.String(128), nullable=False, default=""),
    sa.Column("tokenizer_revision", sa.String(128), nullable=False, default=""),
    sa.Column("rank", sa.Integer, nullable=False),
    sa.Column("alpha", sa.Float, nullable=False),
    sa.Column("format", sa.String(32), nullable=False),
    sa.Column("artifact_uri", sa.String(1024), nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("size_bytes", sa.BigInteger, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("priority_tier", sa.String(64), nullable=False),
    sa.Column("target_modules", sa.String(512), nullable=False),  # comma-separated
    sa.Column("signature", sa.String(256), nullable=False, default=""),
    sa.Column("signer", sa.String(64), nullable=False, default=""),
    sa.Column("source_uri", sa.String(1024), nullable=False, default=""),
    sa.Column("created_at", sa.Float, nullable=False),
)

releases = sa.Table(
    "lora_releases",
    METADATA,
    sa.Column("adapter_id", sa.String(128), primary_key=True),
    sa.Column("stable_version", sa.String(128), nullable=True),
    sa.Column("canary_version", sa.String(128), nullable=True),
    sa.Column("canary_percent", sa.Float, nullable=False, default=0.0),
    sa.Column("rollback_to", sa.String(128), nullable=True),
    sa.Column("updated_at", sa.Float, nullable=False),
)

audit_log = sa.Table(
    "lora_audit_log",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("actor", sa.String(128), nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("adapter_id", sa.String(128), nullable=False),
    sa.Column("version", sa.String(128), nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(1024), nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("engine", sa.String(256), nullable=False),
)

_SQLITE_GUARDS = [
    f"CREATE TRIGGER IF NOT EXISTS lora_audit_no_{op.lower()} BEFORE {op} ON lora_audit_log "
    "BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"
    for op in ("UPDATE", "DELETE")
]
_POSTGRES_GUARDS = [
    "CREATE OR REPLACE FUNCTION lora_audit_append_only() RETURNS trigger AS $$ "
    "BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$ LANGUAGE plpgsql",
    "DROP TRIGGER IF EXISTS lora_audit_append_only ON lora_audit_log",
    "CREATE TRIGGER lora_audit_append_only BEFORE UPDATE OR DELETE ON lora_audit_log "
    "FOR EACH STATEMENT EXECUTE FUNCTION lora_audit_append_only()",
]

_engines: dict[str, sa.Engine] = {}
_lock = threading.Lock()


def open_database(url: str) -> sa.Engine:
    """An engine for ``url`` with the tables and guards created (one engine per URL)."""
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _create(url)
            _engines[url] = engine
        return engine


def _create(url: str) -> sa.Engine:
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 30})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        guards = _SQLITE_GUARDS
    elif parsed.get_backend_name() == "postgresql":
        require("psycopg", "postgres")
        engine = sa.create_engine(url, pool_pre_ping=True)
        guards = _POSTGRES_GUARDS
    else:
        from kvstack.errors import ConfigError

        raise ConfigError(f"registry_url {url!r}: use sqlite:///… or postgresql+psycopg://…")
    with engine.begin() as conn:
        METADATA.create_all(conn)
        for statement in guards:
            conn.exec_driver_sql(statement)
    return engine


def _sqlite_pragmas(dbapi_conn: object, _record: object) -> None:
    cursor = dbapi_conn.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")  # readers (routers) never block the CLI's writes
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
