"""Where the connector's scheduler asks its workers: a directory only the engine's user may
enter, an owner-only socket in it, a clear refusal of a directory anyone else could use, and
the sockets of killed workers swept away."""

from __future__ import annotations

import os
import socket
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
    sweep_stale_sockets,
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


def _dead_socket(path: Path, age_s: float) -> None:
    """A socket file nobody listens on (its process gone), last bound ``age_s`` ago."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the file stays, as when a worker is killed
    os.utime(path, (time.time() - age_s, time.time() - age_s))


def test_sockets_left_by_killed_workers_are_swept(tmp: Path) -> None:
    live_endpoint = lookup_endpoint("engine-live", 0)  # creates the directory
    live = LookupServer(live_endpoint, lambda keys: PrefixAnswer(len(keys), 0))
    os.utime(tmp / "engine-live-0.sock", (time.time() - 600, time.time() - 600))
    _dead_socket(tmp / "engine-dead-0.sock", age_s=600)
    _dead_socket(tmp / "engine-young-0.sock", age_s=5)  # may be between bind and listen
    (tmp / "notes.sock").write_text("not a socket")
    os.utime(tmp / "notes.sock", (time.time() - 600, time.time() - 600))
    server = LookupServer(lookup_endpoint("engine-new", 0), lambda keys: PrefixAnswer(0, 0))
    client = LookupClient([live_endpoint], timeout_s=5.0)
    try:
        left = sorted(p.name for p in tmp.iterdir())
        assert left == ["engine-live-0.sock", "engine-new-0.sock", "engine-young-0.sock",
                        "notes.sock"]  # fmt: skip
        lookup = client.start([[b"k" * 16] * 2])
        deadline = time.monotonic() + 5
        while (answer := client.poll(lookup)) is None and time.monotonic() < deadline:
            pass
        assert answer == PrefixAnswer(2, 0)  # the live server still answers
    finally:
        client.close()
        server.close()
        live.close()
    assert sweep_stale_sockets(tmp, now=time.time() + 120) == 1  # the young one, later
