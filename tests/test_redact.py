"""Secrets never printed: URL passwords are masked in logs, errors, ``kvstack config show`` and
backend ids (metric labels).

The finding: ``lora.registry_url`` (with its PostgreSQL password) and ``redis://user:pw@…``
tier URLs were logged at start and printed by ``kvstack config show``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvstack.errors import ConfigError, RequestError
from kvstack.log import RedactingFilter
from kvstack.redact import redact_data, redact_text
from kvstack.router.fleet.config import BackendConfig
from kvstack.router.fleet.discovery.static import backend_from_config
from kvstack.stack.ports import free_port

PLANTED = "Planted-Pw-7c1e"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql+psycopg://lora:s3cr%40t@db:5432/lora", "postgresql+psycopg://lora:***@db:5432/lora"),
        ("redis://default:pw@valkey:6379/0?prefix=kv:", "redis://default:***@valkey:6379/0?prefix=kv:"),
        ("rediss://:only-pw@h1:6379,h2:6379/0", "rediss://:***@h1:6379,h2:6379/0"),
        ("s3://b/p?endpoint_url=http://m:9000&secret_key=abc", "s3://b/p?endpoint_url=http://m:9000&secret_key=***"),
        ("redis://h:6379/0?password=pw&ttl_s=3", "redis://h:6379/0?password=***&ttl_s=3"),
        ("redis://h:6379/0?password_env=REDIS_PW", "redis://h:6379/0?password_env=REDIS_PW"),
        ("redis://user@h:6379/0", "redis://user@h:6379/0"),
        ("http://10.0.0.1:8000/v1/models", "http://10.0.0.1:8000/v1/models"),
        ("a 'redis://u:p@h/0', http://x:y@z/", "a 'redis://u:***@h/0', http://x:***@z/"),
    ],
)  # fmt: skip
def test_redact_text_masks_only_the_password(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_errors_config_dumps_and_backend_ids_are_masked() -> None:
    url = f"redis://kv:{PLANTED}@h:6379/0"
    assert PLANTED not in str(ConfigError(f"bad tier URL {url!r}"))
    assert PLANTED not in RequestError(f"cannot use {url}").message
    dumped = redact_data({"kv": {"tiers": [url]}, "n": 3})
    assert dumped == {"kv": {"tiers": ["redis://kv:***@h:6379/0"]}, "n": 3}
    backend = backend_from_config(BackendConfig(url=f"http://ops:{PLANTED}@10.0.0.1:8000"))
    assert backend.id == "http://ops:***@10.0.0.1:8000"  # the label of every backend metric


def test_the_logging_filter_masks_messages_arguments_and_tracebacks() -> None:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep()
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("tests.redact")
    logger.addHandler(handler)
    try:
        logger.warning("connecting to %s", f"postgresql://u:{PLANTED}@db/x")
        try:
            raise OSError(f"refused: redis://:{PLANTED}@h:1/0")
        except OSError:
            logger.exception("tier failed")
    finally:
        logger.removeHandler(handler)
    assert records and not any(PLANTED in r for r in records)
    assert "postgresql://u:***@db/x" in records[0] and "Traceback" in records[1]


def _run(*args: str, config: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVSTACK_CONFIG": str(config), "KVSTACK_LOG_LEVEL": "DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "kvstack", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _planted_config(tmp_path: Path) -> Path:
    closed = free_port()  # nothing listens: every connection attempt fails
    config = {
        "kv": {"tiers": ["cpu://?size=1MiB", f"redis://kv:{PLANTED}@127.0.0.1:{closed}/0"]},
        "router": {
            "host": "127.0.0.1",
            "port": free_port(),
            "backends": [{"url": f"http://ops:{PLANTED}@127.0.0.1:{closed}"}],
            "adapters": {"enabled": True},
        },
        "lora": {"registry_url": f"postgresql+psycopg://lora:{PLANTED}@127.0.0.1:{closed}/lora"},
    }
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_config_show_never_prints_a_planted_password(tmp_path: Path) -> None:
    shown = _run("config", "show", config=_planted_config(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert PLANTED not in shown.stdout + shown.stderr
    assert "postgresql+psycopg://lora:***@127.0.0.1" in shown.stdout
    assert "redis://kv:***@127.0.0.1" in shown.stdout


def test_a_router_failing_to_start_logs_no_planted_password(tmp_path: Path) -> None:
    """The router logs its effective config (backends) and the lora section's (the registry
    URL) at start, at DEBUG everything else too, then fails: the registry is unreachable."""
    started = _run("router", config=_planted_config(tmp_path), timeout=120)
    output = started.stdout + started.stderr
    assert started.returncode != 0
    assert "effective router config" in output and "effective lora config" in output
    assert PLANTED not in output
    assert "postgresql+psycopg://lora:***@127.0.0.1" in output
