"""``file:///var/kv?size=100GiB&fsync=false&queue=64&compression=none`` — chunks on local disk.

One file per chunk, ``<root>/<first two hex digits>/<key hex>.kvc`` in the format of
:mod:`kvstack.kv.format`. Writes go through a bounded background queue, so ``put`` never waits
for the disk: when the queue is full the write is dropped and counted. Each write goes to a
temporary file that is renamed into place (optionally after ``fsync``), so a reader, a crash or
``kill -9`` never sees a half-written chunk under its final name. Reads verify header and payload
checksum; a corrupt or truncated file is deleted and reported as a miss.

The directory may be shared by several processes (engines on one host, or a shared filesystem):
a chunk another process wrote is adopted on first ``contains``. The byte budget is enforced by
each process over the files it knows of (LRU by default); eviction deletes files, and a reader
that loses the race sees a miss.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import secrets
import threading
import time
from collections import deque
from pathlib import Path

from kvstack.errors import ChunkFormatError, ConfigError
from kvstack.kv.format import (
    COMPRESSIONS,
    HEADER_BYTES,
    ChunkHeader,
    compress,
    decompress,
    encode_header,
    parse_header,
    payload_checksum,
)
from kvstack.kv.keys import KEY_BYTES, ChunkKey
from kvstack.kv.policy import make_policy
from kvstack.kv.tensors import byte_view, dtype_name, torch, torch_dtype
from kvstack.kv.tiers.base import Tier, TierEvent, TierStats, TierURL
from kvstack.kv.tiers.metrics import TierMetrics
from kvstack.log import IncidentLogger
from kvstack.section import parse_size

__all__ = ["FileTier"]

log = logging.getLogger(__name__)
SUFFIX = ".kvc"
TMP_DIR = ".tmp"
STALE_TMP_S = 3600.0


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes", "on")


class FileTier(Tier):
    scheme = "file"

    def __init__(
        self,
        root: str | Path,
        capacity_bytes: int,
        *,
        fsync: bool = False,
        queue_depth: int = 64,
        compression: str = "none",
        policy: str = "lru",
        name: str = "file",
    ) -> None:
        super().__init__(name)
        if capacity_bytes <= 0:
            raise ConfigError(f"file tier size must be > 0 bytes, got {capacity_bytes}")
        if queue_depth <= 0:
            raise ConfigError(f"file tier queue must be > 0, got {queue_depth}")
        if compression not in COMPRESSIONS:
            raise ConfigError(
                f"unknown compression {compression!r}; known: {', '.join(COMPRESSIONS)}"
            )
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.queue_depth = queue_depth
        self.compression = compression
        self._tmp = self.root / TMP_DIR
        self._lock = threading.Lock()
        self._index: dict[ChunkKey, int] = {}  # key -> file size in bytes
        self._policy = make_policy(policy)
        self._used = 0
        self._queue: deque[tuple[ChunkKey, torch.Tensor]] = deque()
        self._pending: set[ChunkKey] = set()
        self._outstanding = 0
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._metrics = TierMetrics(name)
        self._incidents = IncidentLogger(log)
        try:
            self._tmp.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"file tier cannot create {str(self.root)!r}: {exc.strerror}"
            ) from None
        self._clean_tmp()
        self._scan()
        self._writer = threading.Thread(
            target=self._write_loop, name=f"kvstack-{name}-writer", daemon=True
        )
        self._writer.start()

    @classmethod
    def from_url(cls, url: TierURL, name: str = "file") -> FileTier:
        root = url.path if not url.netloc else f"/{url.netloc}{url.path}"
        if not root or root == "/":
            raise ConfigError(f"file tier URL {url.url!r} needs a directory, e.g. file:///var/kv")
        size = parse_size(url.pop("size", "10GiB") or "10GiB", "file tier size")
        queue = url.pop("queue", "64") or "64"
        if not queue.isdigit():
            raise ConfigError(f"file tier queue must be a positive integer, got {queue!r}")
        tier = dict(
            fsync=_truthy(url.pop("fsync", "false")),
            queue_depth=int(queue),
            compression=url.pop("compression", "none") or "none",
            policy=url.pop("policy", "lru") or "lru",
        )
        url.reject_unknown()
        return cls(root, size, name=name, **tier)  # type: ignore[arg-type]

    # -- paths and startup -----------------------------------------------------------------
    def _path(self, key: ChunkKey) -> Path:
        hexkey = key.hex()
        return self.root / hexkey[:2] / f"{hexkey}{SUFFIX}"

    def _clean_tmp(self) -> None:
        """Remove temporary files left by crashed writers (dead PID, or older than an hour)."""
        now = time.time()
        for entry in os.scandir(self._tmp):
            parts = entry.name.split(".")
            pid = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else -1
            try:
                stale = now - entry.stat().st_mtime > STALE_TMP_S or not _pid_alive(pid)
                if stale:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass

    def _scan(self) -> None:
        """Rebuild the index from the directory, oldest files first in eviction order."""
        found: list[tuple[float, ChunkKey, int]] = []
        for sub in os.scandir(self.root):
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for entry in os.scandir(sub.path):
                key = _key_from_name(entry.name)
                if key is None:
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                found.append((st.st_mtime, key, st.st_size))
        found.sort()
        with self._lock:
            for _, key, size in found:
                self._index[key] = size
                self._policy.on_insert(key)
                self._used += size
        if found:
            log.info(
                "file tier %s: %d chunks (%d bytes) found in %s",
                self.name,
                len(found),
                self._used,
                self.root,
            )
        # A directory that grew past the budget (budget lowered, several writers) shrinks now.
        self._evict_for(0)

    # -- reads -----------------------------------------------------------------------------
    def contains(self, key: ChunkKey) -> bool:
        if key in self._index:
            return True
        try:  # written by another process sharing the directory?
            size = self._path(key).stat().st_size
        except OSError:
            return False
        self._adopt(key, size)
        return True

    def _adopt(self, key: ChunkKey, size: int) -> None:
        with self._lock:
            if key not in self._index:
                self._index[key] = size
                self._policy.on_insert(key)
                self._used += size

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                header = parse_header(f.read(HEADER_BYTES), expect_key=key)
                out = torch.empty(header.shape, dtype=torch_dtype(header.dtype))
                ok = self._read_payload(key, f, header, out)
        except FileNotFoundError:
            self._miss(key)
            return None
        except ChunkFormatError as exc:
            self._corrupt(key, exc)
            return None
        return out if ok else None

    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        start = time.perf_counter()
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                header = parse_header(f.read(HEADER_BYTES), expect_key=key)
                if header.dtype != dtype_name(out.dtype) or header.shape != tuple(out.shape):
                    self._metrics.miss()  # another layout under the same key: not ours
                    return False
                direct = out.is_contiguous() and out.device.type == "cpu"
                target = out if direct else torch.empty(out.shape, dtype=out.dtype)
                ok = self._read_payload(key, f, header, target)
        except FileNotFoundError:
            self._miss(key)
            return False
        except ChunkFormatError as exc:
            self._corrupt(key, exc)
            return False
        if ok and not direct:
            out.copy_(target)
        if ok:
            self._metrics.get_seconds.observe(time.perf_counter() - start)
        return ok

    def _read_payload(
        self, key: ChunkKey, f: io.RawIOBase, header: ChunkHeader, out: torch.Tensor
    ) -> bool:
        raw = byte_view(out)
        if len(raw) != header.raw_bytes:
            raise ChunkFormatError(f"payload is {header.raw_bytes} bytes, expected {len(raw)}")
        if header.compression == "none":
            got = _read_exact_into(f, raw)
            if got != header.stored_bytes or f.read(1):
                raise ChunkFormatError(f"truncated or oversized payload ({got} bytes)")
            if payload_checksum(raw) != header.checksum:
                raise ChunkFormatError("payload checksum mismatch")
        else:
            stored = f.read(header.stored_bytes + 1) or b""
            if len(stored) != header.stored_bytes or payload_checksum(stored) != header.checksum:
                raise ChunkFormatError("compressed payload truncated or checksum mismatch")
            raw[:] = decompress(stored, header.compression, header.raw_bytes)
        with self._lock:
            if key in self._index:
                self._policy.on_access(key)
        self._metrics.hit(header.raw_bytes)
        return True

    def _miss(self, key: ChunkKey) -> None:
        self._metrics.miss()
        self._forget(key)

    def _corrupt(self, key: ChunkKey, exc: Exception) -> None:
        self._incidents.warning(
            "corrupt", "file tier %s: dropping corrupt chunk %s: %s", self.name, key.hex(), exc
        )
        self._metrics.corrupt()
        self._metrics.miss()
        try:
            os.unlink(self._path(key))
        except OSError:
            pass
        if self._forget(key):
            self._emit(TierEvent("removed", self.name, key, reason="corrupt"))

    def _forget(self, key: ChunkKey) -> bool:
        with self._lock:
            size = self._index.pop(key, None)
            if size is None:
                return False
            self._policy.on_remove(key)
            self._used -= size
            return True

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        if not chunk.is_contiguous() or chunk.device.type != "cpu":
            raise ValueError("file tier chunks must be contiguous CPU tensors")
        with self._lock:
            if self._closed:
                return False
            if key in self._index or key in self._pending:
                return True
            if len(self._queue) >= self.queue_depth:
                self._metrics.dropped()
                return False
            self._queue.append((key, chunk))
            self._pending.add(key)
            self._outstanding += 1
            self._cond.notify_all()
        return True

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                key, chunk = self._queue.popleft()
            try:
                self._write(key, chunk)
            except Exception:  # the writer thread must survive anything one chunk does
                log.exception("file tier %s: unexpected error writing a chunk", self.name)
                self._metrics.dropped()
            finally:
                del chunk  # release the borrowed memory before waiting for more work
                with self._lock:
                    self._pending.discard(key)
                    self._outstanding -= 1
                    self._cond.notify_all()

    def _write(self, key: ChunkKey, chunk: torch.Tensor) -> None:
        start = time.perf_counter()
        raw = byte_view(chunk)
        stored = compress(raw, self.compression)
        header = encode_header(
            key, dtype_name(chunk.dtype), tuple(chunk.shape), stored, len(raw), self.compression
        )
        size = len(header) + len(stored)
        if size > self.capacity_bytes or not self._evict_for(size):
            self._metrics.dropped()
            return
        final = self._path(key)
        tmp = self._tmp / f"{key.hex()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            final.parent.mkdir(exist_ok=True)
            with open(tmp, "wb", buffering=0) as f:
                f.write(header)
                _write_all(f, stored)
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            self._write_failed(key, tmp, size, exc)
            return
        with self._lock:
            if key not in self._index:
                self._index[key] = size
                self._policy.on_insert(key)
            else:
                self._used -= size  # adopted meanwhile: the reservation was counted twice
        self._metrics.wrote(size)
        self._metrics.put_seconds.observe(time.perf_counter() - start)
        self._emit(TierEvent("stored", self.name, key))

    def _write_failed(self, key: ChunkKey, tmp: Path, size: int, exc: OSError) -> None:
        with self._lock:
            self._used -= size
        try:
            os.unlink(tmp)
        except OSError:
            pass
        kind = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "write error"
        self._incidents.warning(
            kind, "file tier %s: %s, chunk not stored: %s", self.name, kind, exc
        )
        self._metrics.dropped()
        self._metrics.error("put")

    def _evict_for(self, size: int) -> bool:
        """Evict until ``size`` more bytes fit, then reserve them. False if that is impossible."""
        victims: list[ChunkKey] = []
        with self._lock:
            while self._used + size > self.capacity_bytes:
                victim = self._policy.evict(lambda _k: True)
                if victim is None:
                    break
                self._used -= self._index.pop(victim)  # type: ignore[call-overload]
                victims.append(victim)  # type: ignore[arg-type]
            fits = self._used + size <= self.capacity_bytes
            if fits:
                self._used += size
        for victim in victims:
            try:
                os.unlink(self._path(victim))
            except OSError:
                pass
            self._metrics.evicted()
            self._emit(TierEvent("removed", self.name, victim, reason="evicted"))
        return fits

    def remove(self, key: ChunkKey) -> bool:
        try:
            os.unlink(self._path(key))
            existed = True
        except FileNotFoundError:
            existed = False
        forgot = self._forget(key)
        if existed or forgot:
            self._emit(TierEvent("removed", self.name, key, reason="removed"))
        return existed or forgot

    # -- lifecycle and bookkeeping ---------------------------------------------------------
    def flush(self, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._outstanding:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._writer.join()

    def stats(self) -> TierStats:
        with self._lock:
            stats = self._metrics.snapshot(len(self._index), self._used, self.capacity_bytes)
            stats.extra["queued_writes"] = float(len(self._queue))
            return stats

    def check_integrity(self) -> None:
        self.flush()
        with self._lock:
            assert sum(self._index.values()) == self._used, "used bytes != sum of indexed sizes"
            assert self._used <= self.capacity_bytes, "over capacity"
            assert self._policy.keys() == set(self._index), "policy and index disagree"
            assert not self._pending and not self._queue, "writes left pending"
            on_disk = {k for k in self._index if self._path(k).exists()}
            assert on_disk == set(self._index), (
                f"{len(self._index) - len(on_disk)} indexed chunks missing"
            )


def _key_from_name(name: str) -> ChunkKey | None:
    if not name.endswith(SUFFIX) or len(name) != 2 * KEY_BYTES + len(SUFFIX):
        return None
    try:
        return ChunkKey(bytes.fromhex(name[: 2 * KEY_BYTES]))
    except ValueError:
        return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_exact_into(f: io.RawIOBase, buf: memoryview) -> int:
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


def _write_all(f: io.RawIOBase, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = f.write(view) or 0
        view = view[n:]
