"""The cluster secret: derived keys, MACs, rotation, the loopback rule, secret files."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from kvstack.errors import ConfigError
from kvstack.security import (
    ClusterKeys,
    SecurityConfig,
    check_bind,
    is_loopback,
    load_keys,
    write_secret_file,
)

SECRET = b"s" * 32
OTHER = b"o" * 32


def test_purposes_get_distinct_keys_and_macs_verify_only_under_their_key() -> None:
    keys = ClusterKeys(SECRET)
    assert keys.key("peer") != keys.key("chunk-mac")
    tag = keys.mac("chunk-mac", b"header", b"payload")
    assert keys.check("chunk-mac", tag, b"header", b"payload")
    assert not keys.check("chunk-mac", tag, b"header", b"payloaX")
    assert not keys.check("peer", tag, b"header", b"payload")
    assert not ClusterKeys(OTHER).check("chunk-mac", tag, b"header", b"payload")
    # parts are length-prefixed: moving bytes between parts changes the MAC
    assert not keys.check("chunk-mac", tag, b"headerp", b"ayload")


def test_rotation_signs_with_the_new_secret_and_still_verifies_the_old() -> None:
    old = ClusterKeys(OTHER)
    rotating = ClusterKeys(SECRET, OTHER)
    tag_old = old.mac("peer", b"x")
    assert rotating.check("peer", tag_old, b"x")
    assert rotating.mac("peer", b"x") == ClusterKeys(SECRET).mac("peer", b"x")
    assert not ClusterKeys(SECRET).check("peer", tag_old, b"x")


def test_short_secrets_and_unknown_purposes_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        ClusterKeys(b"short")
    with pytest.raises(ValueError, match="unknown key purpose"):
        ClusterKeys(SECRET).key("nope")


def test_the_secret_is_never_in_the_repr() -> None:
    keys = ClusterKeys(SECRET, OTHER)
    assert "sss" not in repr(keys) and "ooo" not in repr(keys)
    assert keys.fingerprint in repr(keys) and "rotating" in repr(keys)


def test_secret_files_are_created_0600_and_loaded(tmp_path: Path) -> None:
    path = write_secret_file(tmp_path / "secrets" / "cluster")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keys = load_keys(SecurityConfig(cluster_secret_file=str(path)))
    assert (
        keys is not None
        and keys.fingerprint == load_keys(SecurityConfig(cluster_secret_file=str(path))).fingerprint
    )  # type: ignore[union-attr]
    assert load_keys(SecurityConfig()) is None
    with pytest.raises(FileExistsError):
        write_secret_file(path)


def test_a_bad_secret_file_is_a_clear_error(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(ConfigError, match="holds 3 bytes"):
        load_keys(SecurityConfig(cluster_secret_file=str(short)))
    with pytest.raises(ConfigError, match="cannot read"):
        load_keys(SecurityConfig(cluster_secret_file=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="previous_secret_file is set without"):
        load_keys(SecurityConfig(previous_secret_file=str(short)))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("*", False), ("10.0.0.5", False), ("example.com", False)],
)  # fmt: skip
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_binding_beyond_loopback_needs_a_secret_or_an_explicit_opt_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check_bind("127.0.0.1", "the index", None, SecurityConfig())
    check_bind("0.0.0.0", "the index", ClusterKeys(SECRET), SecurityConfig())
    with pytest.raises(ConfigError, match="without authentication"):
        check_bind("0.0.0.0", "the index", None, SecurityConfig())
    with caplog.at_level(logging.WARNING, logger="kvstack.security"):
        check_bind("0.0.0.0", "the index", None, SecurityConfig(insecure_no_auth=True))
    assert "WITHOUT authentication" in caplog.text


def test_the_init_secret_verb_creates_a_0600_secret_and_never_prints_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "run" / "cluster-secret"
    argv = [sys.executable, "-m", "kvstack", "security", "init-secret", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) >= 64 and secret not in done.stdout + done.stderr
    keys = load_keys(SecurityConfig(cluster_secret_file=str(path)))
    assert keys is not None and keys.fingerprint in done.stdout
    again = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 1 and "not overwritten" in again.stderr
    assert path.read_text().strip() == secret


def test_the_index_token_verb_prints_the_scrapers_credential(tmp_path: Path) -> None:
    import subprocess
    import sys

    from kvstack.index.auth import bearer_header, check_bearer

    path = write_secret_file(tmp_path / "cluster-secret")
    argv = [sys.executable, "-m", "kvstack", "security", "index-token", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    token = done.stdout.strip()
    keys = load_keys(SecurityConfig(cluster_secret_file=str(path)))
    assert keys is not None and check_bearer(keys, f"Bearer {token}")
    assert bearer_header(keys) == f"Bearer {token}"
    assert path.read_text().strip() not in done.stdout
