"""Where the connector's scheduler asks its workers: a directory only the engine's user may
enter, an owner-only socket in it, and a clear refusal of a directory anyone else could use."""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

import pytest

from kvstack.errors import ConfigError
from kvstack.integrations.vllm.lookup import (
    LookupClient,
    LookupServer,
    PrefixAnswer,
    lookup_endpoint,
)


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path / f"kvstack-{os.getuid()}"


def test_the_socket_is_owner_only_in_a_private_directory(tmp: Path) -> None:
    endpoint = lookup_endpoint("engine-a", 0)
    assert endpoint == f"ipc://{tmp / 'engine-a-0.sock'}"
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o700
    server = LookupServer(endpoint, lambda keys: PrefixAnswer(len(keys), 0))
    client = LookupClient([endpoint], timeout_s=5.0)
    try:
        assert stat.S_IMODE((tmp / "engine-a-0.sock").stat().st_mode) == 0o600
        lookup = client.start([[b"k" * 16] * 3])
        deadline = time.monotonic() + 5
        while (answer := client.poll(lookup)) is None and time.monotonic() < deadline:
            pass
        assert answer == PrefixAnswer(3, 0)
    finally:
        client.close()
        server.close()
    assert not (tmp / "engine-a-0.sock").exists()


def test_a_directory_others_can_enter_is_refused(tmp: Path) -> None:
    tmp.mkdir(mode=0o700)
    tmp.chmod(0o755)
    with pytest.raises(ConfigError, match=r"kvstack-\d+ must be a directory .* mode drwxr-xr-x"):
        lookup_endpoint("engine-a", 0)


def test_a_link_in_its_place_is_refused(tmp: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    tmp.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="must be a directory owned by uid"):
        lookup_endpoint("engine-a", 0)
