"""The file tier: restart, atomic writes, damaged files, budget, disk full, the write queue."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstack.errors import ConfigError
from kvstack.kv.format import HEADER_BYTES
from kvstack.kv.tiers import TierEvent, make_tier
from kvstack.kv.tiers.file import chunkfile
from kvstack.kv.tiers.file.tier import FileTier
from tests.kv.tiers.tier_contract import SHAPE, chunk, key

FILE_BYTES = HEADER_BYTES + 2 * 2 * 16 * 2 * 8 * 2


def written(tier: FileTier, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        assert tier.put(key(i), chunk(i))
    assert tier.flush(timeout_s=30)


def test_restart_rebuilds_the_index_in_age_order(tmp_path: Path) -> None:
    tier = FileTier(tmp_path, 4 * FILE_BYTES)
    written(tier, 4)
    for i, age in enumerate([40, 30, 20, 10]):  # key(0) oldest
        os.utime(chunkfile.chunk_path(tmp_path, key(i)), (1e9 - age, 1e9 - age))
    tier.close()
    again = FileTier(tmp_path, 4 * FILE_BYTES)
    assert again.stats().entries == 4 and again.stats().bytes_used == 4 * FILE_BYTES
    written(again, 1, start=10)  # evicts the oldest file
    assert not again.contains(key(0)) and again.contains(key(1))
    got = again.get(key(3))
    assert got is not None and torch.equal(got, chunk(3))
    again.check_integrity()
    again.close()


def test_a_lowered_budget_shrinks_the_directory_at_start(tmp_path: Path) -> None:
    tier = FileTier(tmp_path, 10 * FILE_BYTES)
    written(tier, 6)
    tier.close()
    small = FileTier(tmp_path, 2 * FILE_BYTES)
    assert small.stats().entries == 2
    assert len(list(tmp_path.glob("??/*.kvc"))) == 2
    small.check_integrity()
    small.close()


def test_damaged_files_are_removed_at_start_and_foreign_files_left_alone(tmp_path: Path) -> None:
    tier = FileTier(tmp_path, 10 * FILE_BYTES)
    written(tier, 3)
    tier.close()
    truncated = chunkfile.chunk_path(tmp_path, key(0))
    truncated.write_bytes(truncated.read_bytes()[:-10])
    swapped = chunkfile.chunk_path(tmp_path, key(1))
    os.replace(chunkfile.chunk_path(tmp_path, key(2)), swapped)  # key(2)'s bytes under key(1)
    foreign = tmp_path / "00" / "notes.txt"
    foreign.parent.mkdir(exist_ok=True)
    foreign.write_text("not a chunk")
    other = tmp_path / "README"
    other.write_text("mine")
    again = FileTier(tmp_path, 10 * FILE_BYTES)
    assert again.stats().entries == 0 and again.stats().corrupt == 2
    assert not truncated.exists() and not swapped.exists()
    assert foreign.read_text() == "not a chunk" and other.read_text() == "mine"
    again.check_integrity()
    again.close()


def test_a_corrupt_file_is_a_miss_and_is_dropped(tmp_path: Path) -> None:
    tier = FileTier(tmp_path, 10 * FILE_BYTES)
    events: list[TierEvent] = []
    tier.add_listener(events.append)
    written(tier, 1)
    path = chunkfile.chunk_path(tmp_path, key(0))
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 100] ^= 0x10  # one bit in the payload
    path.write_bytes(bytes(data))
    assert tier.get_into(key(0), torch.empty(SHAPE, dtype=torch.float16)) is False
    assert not path.exists() and not tier.contains(key(0))
    assert events[-1].kind == "removed" and events[-1].reason == "corrupt"
    assert tier.stats().corrupt == 1
    tier.check_integrity()
    tier.close()


def test_a_failed_write_leaves_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = chunkfile._write_all

    def half_then_fail(f: Any, data: Any) -> None:
        if len(data) > HEADER_BYTES:
            real(f, memoryview(data)[: len(data) // 2])
            raise OSError(errno.EIO, "injected I/O error")
        real(f, data)

    monkeypatch.setattr(chunkfile, "_write_all", half_then_fail)
    tier = FileTier(tmp_path, 10 * FILE_BYTES)
    assert tier.put(key(0), chunk(0))  # accepted into the queue...
    tier.flush()
    assert not tier.contains(key(0))  # ...but not stored, and nothing half-written remains
    assert not list(tmp_path.glob("??/*")) and not list((tmp_path / ".tmp").iterdir())
    s = tier.stats()
    assert (s.dropped_writes, s.errors, s.bytes_used) == (1, 1, 0)
    tier.check_integrity()
    tier.close()


def test_disk_full_fails_soft_and_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failing file object stands in for a full disk (see the tmpfs test for the real thing).
    tier = FileTier(tmp_path, 100 * FILE_BYTES)
    written(tier, 2)
    real_open = open

    def full_disk_open(path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        if "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, mode, *args, **kw)

    monkeypatch.setattr(chunkfile, "open", full_disk_open, raising=False)
    written(tier, 3, start=10)
    s = tier.stats()
    assert (s.entries, s.dropped_writes, s.errors) == (2, 3, 3)
    got = tier.get(key(1))
    assert got is not None and torch.equal(got, chunk(1))
    monkeypatch.undo()
    written(tier, 1, start=20)  # space is back
    assert tier.contains(key(20))
    tier.check_integrity()
    tier.close()


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if os.system(f"mount -t tmpfs -o size=256k tmpfs {mount} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the injected-ENOSPC test covers it")
    try:
        yield mount
    finally:
        os.system(f"umount {mount}")


def test_disk_full_on_a_real_tmpfs(tiny_tmpfs: Path) -> None:
    tier = FileTier(tiny_tmpfs, 10 << 20)  # the budget is far larger than the filesystem
    big = (2, 2, 64, 2, 64)  # 64 KiB per chunk: the 256 KiB filesystem takes three
    for i in range(8):
        tier.put(key(i), chunk(i, shape=big))
        tier.flush()
    s = tier.stats()
    assert 1 <= s.entries < 8 and s.dropped_writes == 8 - s.entries and s.errors >= 1
    for i in range(8):
        got = tier.get(key(i))
        assert got is None or torch.equal(got, chunk(i, shape=big))
    tier.check_integrity()
    tier.close()


def test_the_write_queue_is_bounded_and_put_never_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = threading.Event(), threading.Event()
    real = chunkfile.write_chunk_file

    def blocked(*args: Any, **kw: Any) -> None:
        entered.set()
        gate.wait(30)
        real(*args, **kw)

    monkeypatch.setattr(chunkfile, "write_chunk_file", blocked)
    tier = FileTier(tmp_path, 100 * FILE_BYTES, queue_depth=3)
    assert tier.put(key(0), chunk(0))
    assert entered.wait(10)  # the writer holds chunk 0 and waits on the "disk"
    results: list[bool] = []
    putter = threading.Thread(
        target=lambda: results.extend(tier.put(key(i), chunk(i)) for i in range(1, 6))
    )
    putter.start()
    putter.join(10)
    assert not putter.is_alive(), "put waited for the disk"
    assert results == [True] * 3 + [False] * 2  # three fit in the queue, two are dropped
    assert tier.stats().dropped_writes == 2 and tier.stats().extra["queued_writes"] == 3
    gate.set()
    assert tier.flush(timeout_s=30)
    assert tier.stats().entries == 4
    tier.check_integrity()
    tier.close()


def test_the_write_queue_is_bounded_in_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = threading.Event(), threading.Event()
    real = chunkfile.write_chunk_file

    def blocked(*args: Any, **kw: Any) -> None:
        entered.set()
        gate.wait(30)
        real(*args, **kw)

    monkeypatch.setattr(chunkfile, "write_chunk_file", blocked)
    tier = FileTier(tmp_path, 100 * FILE_BYTES, queue_bytes=3 * 2048)
    assert tier.put(key(0), chunk(0)) and entered.wait(10)
    assert [tier.put(key(i), chunk(i)) for i in range(1, 6)] == [True] * 3 + [False] * 2
    assert tier.stats().extra["queued_bytes"] == 3 * 2048
    gate.set()
    assert tier.flush(timeout_s=30) and tier.stats().entries == 4
    tier.close()


def test_a_directory_shared_by_two_tiers(tmp_path: Path) -> None:
    a = FileTier(tmp_path, 10 * FILE_BYTES, name="a")
    b = FileTier(tmp_path, 10 * FILE_BYTES, name="b")
    written(a, 1)
    assert b.contains(key(0))  # adopted from the other writer
    got = b.get(key(0))
    assert got is not None and torch.equal(got, chunk(0))
    a.remove(key(0))
    assert b.get(key(0)) is None and not b.contains(key(0))
    for tier in (a, b):
        tier.check_integrity()
        tier.close()


def test_chunks_larger_than_the_budget_are_dropped(tmp_path: Path) -> None:
    tier = FileTier(tmp_path, FILE_BYTES - 1)
    assert tier.put(key(0), chunk(0))
    tier.flush()
    assert not tier.contains(key(0)) and tier.stats().dropped_writes == 1
    tier.close()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("file://relative/kv", "needs an absolute directory"),
        ("file:///", "needs an absolute directory"),
        ("file:///tmp/kv?size=lots", "file tier size 'lots' is not a size"),
        ("file:///tmp/kv?queue=0", "file tier queue must be a positive integer, got '0'"),
        ("file:///tmp/kv?queue=-3", "file tier queue must be a positive integer"),
        ("file:///tmp/kv?compression=gzip", "unknown compression 'gzip'"),
        ("file:///tmp/kv?fsync=true&mode=fast", "unknown parameter"),
        ("ftp:///tmp/kv", "unknown tier scheme 'ftp'"),
        ("/tmp/kv", "has no scheme"),
    ],
)
def test_bad_urls_are_config_errors(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        make_tier(url)


def test_url_parameters(tmp_path: Path) -> None:
    tier = make_tier(
        f"file://{tmp_path}?size=5MiB&fsync=1&queue=8&queue_size=64MiB&compression=zstd&level=3"
    )
    assert isinstance(tier, FileTier)
    assert (tier.capacity_bytes, tier.fsync, tier.compression, tier.level) == (
        5 << 20,
        True,
        "zstd",
        3,
    )
    written(tier, 1)
    got = tier.get(key(0))
    assert got is not None and torch.equal(got, chunk(0))
    tier.close()


def test_queued_chunks_are_readable_and_removable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = threading.Event(), threading.Event()
    real = chunkfile.write_chunk_file

    def blocked(*args: Any, **kw: Any) -> None:
        entered.set()
        gate.wait(30)
        real(*args, **kw)

    monkeypatch.setattr(chunkfile, "write_chunk_file", blocked)
    tier = FileTier(tmp_path, 100 * FILE_BYTES)
    for i in range(3):
        assert tier.put(key(i), chunk(i))
    assert entered.wait(10)  # chunk 0 is being written, 1 and 2 are queued
    assert tier.contains_many([key(0), key(1), key(2), key(3)]) == [True, True, True, False]
    out = torch.empty(SHAPE, dtype=torch.float16)
    assert tier.get_into(key(2), out) and torch.equal(out, chunk(2))  # served from the queue
    got = tier.get(key(0))
    assert got is not None and torch.equal(got, chunk(0))
    assert tier.remove(key(1)) and tier.remove(key(0))  # queued, and in flight
    assert tier.contains_many([key(0), key(1)]) == [False, False]  # gone at once
    assert tier.get(key(0)) is None and not tier.get_into(key(1), out)
    gate.set()
    assert tier.flush(timeout_s=30)
    assert [tier.contains(key(i)) for i in range(3)] == [False, False, True]
    assert sorted(p.name[:8] for p in tmp_path.glob("??/*.kvc")) == [key(2).hex()[:8]]
    tier.check_integrity()
    tier.close()


def test_a_chunk_removed_after_its_file_is_written_but_before_it_is_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is on disk, so a probe (for files of other processes) would adopt it: the
    removal must win all the same, and a new put of the same chunk must not be lost."""
    entered, gate = threading.Event(), threading.Event()
    real = chunkfile.write_chunk_file

    def written_then_blocked(*args: Any, **kw: Any) -> None:
        real(*args, **kw)
        entered.set()
        gate.wait(30)

    monkeypatch.setattr(chunkfile, "write_chunk_file", written_then_blocked)
    tier = FileTier(tmp_path, 100 * FILE_BYTES)
    assert tier.put(key(0), chunk(0)) and entered.wait(10)
    assert chunkfile.chunk_path(tmp_path, key(0)).exists()
    assert tier.remove(key(0))
    assert not tier.contains(key(0)) and tier.get(key(0)) is None
    gate.set()
    assert tier.flush(timeout_s=30)
    assert not tier.contains(key(0)) and not list(tmp_path.glob("??/*.kvc"))
    tier.check_integrity()

    entered.clear()
    gate.clear()
    assert tier.put(key(1), chunk(1)) and entered.wait(10)
    assert tier.remove(key(1))
    assert tier.put(key(1), chunk(1))  # stored again while its first write is in flight
    assert tier.contains(key(1))
    gate.set()
    assert tier.flush(timeout_s=30)
    got = tier.get(key(1))
    assert got is not None and torch.equal(got, chunk(1))
    assert tier.stats().entries == 1
    tier.check_integrity()
    tier.close()


@pytest.mark.parametrize("readers", [1, 4])
def test_a_batch_read_fills_every_buffer_and_names_each_miss(tmp_path: Path, readers: int) -> None:
    tier = make_tier(f"file://{tmp_path}?size=5MiB&readers={readers}")
    assert isinstance(tier, FileTier) and tier.readers == readers
    written(tier, 6)
    Path(tier._path(key(3))).unlink()  # gone from disk
    keys = [key(i) for i in range(6)] + [key(99)]
    with torch.inference_mode():  # as in vLLM's worker: its staging buffers are inference tensors
        outs = [torch.zeros_like(chunk(0)) for _ in keys]
        found = tier.get_many_into(keys, outs)
    assert found == [True, True, True, False, True, True, False]
    for i in (0, 1, 2, 4, 5):
        assert torch.equal(outs[i], chunk(i))
    with pytest.raises(ValueError, match="2 keys but 1 output buffers"):
        tier.get_many_into(keys[:2], outs[:1])
    tier.close()


def test_readers_must_be_a_positive_count(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file tier readers must be a positive integer"):
        make_tier(f"file://{tmp_path}?readers=0")
