"""``file:///var/kv?size=100GiB&fsync=false&queue=64&queue_size=1GiB&compression=none&level=1&readers=4``
— chunks on local disk, one file each (layout and atomicity: :mod:`.chunkfile`).

Writes go through a bounded background queue (:mod:`kvstack.kv.tiers.writer`; ``queue`` chunks
waiting and ``queue_size`` bytes at most), so ``put`` never waits for the disk: when the queue is
full the write is dropped and counted. Chunks waiting in the queue are served from memory. A
failed write (disk full, I/O error) is logged once per incident, counted, and leaves no file
behind; the tier keeps serving what it holds. Reads verify header, file length and payload
checksum; a corrupt or truncated file is deleted and reported as a miss. A load of several
chunks reads up to ``readers`` files at once: a chunk file not in the page cache costs a disk
round trip, and one read after another leaves the disk idle in between (32 cold 3 MiB chunks
on a 2-core host's virtual disk: 62.7 ms one by one, 54.9 ms four at a time, medians of 9
paired runs; a local NVMe drive serves more reads at once than that). Inside vLLM's worker the
reader threads share the interpreter lock with the engine's step, and ``kvstack bench fetch``
measures what that costs on its own (2 cores, 32 chunks of 3 MiB, a step with 1 ms of Python).
With 4 readers the step's p99 was 2.85x its p99 alone from the page cache and 1.42x from disk.
With one reader it was 1.30x and 1.14x, but a fetch from disk took 83 ms instead of 71 ms
(``benchmarks/results/fetch/``). That trades a load's TTFT for the running requests' ITL, so
the default stays 4. In a helper process the same reads cost the step 1.05x to 1.11x.

At start the index is rebuilt from the directory (oldest files first in eviction order): every chunk
file's header and length are checked, bad ones deleted, temporary files of dead writers removed, and
the directory is shrunk to the byte budget. Chunks are compressed per tier with
``compression=zstd|lz4`` (``level`` sets the codec level).

The directory may be shared by several processes on one host: a chunk another process wrote is
adopted on first ``contains`` or read. Each process enforces the budget over the files it knows of
(LRU by default); eviction deletes files, and a reader that loses that race sees a miss.
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvstack.errors import ChunkFormatError, ConfigError
from kvstack.kv.affinity import enter_background
from kvstack.kv.format import DTYPES, HEADER_BYTES, compress, encode_header
from kvstack.kv.keys import ChunkKey
from kvstack.kv.seal import SealFields
from kvstack.kv.tensors import byte_view, dtype_name, torch, torch_dtype
from kvstack.kv.tiers.base import Tier, TierEvent, TierStats, TierURL
from kvstack.kv.tiers.file import chunkfile
from kvstack.kv.tiers.file.file_index import FileIndex
from kvstack.kv.tiers.file.file_url import check_file_options, parse_file_url
from kvstack.kv.tiers.metrics import TierMetrics
from kvstack.kv.tiers.writer import BackgroundWriter, CancelOutcome, WriteJob
from kvstack.kv.trust import ChunkTrust
from kvstack.log import IncidentLogger

__all__ = ["FileTier"]

log = logging.getLogger(__name__)


class FileTier(Tier):
    scheme = "file"

    def __init__(
        self,
        root: str | Path,
        capacity_bytes: int,
        *,
        fsync: bool = False,
        queue_depth: int = 64,
        queue_bytes: int = 1 << 30,
        compression: str = "none",
        level: int = 1,
        policy: str = "lru",
        name: str = "file",
        trust: ChunkTrust | None = None,
        readers: int = 4,
    ) -> None:
        super().__init__(name, trust)
        check_file_options(capacity_bytes, queue_depth, queue_bytes, compression)
        self.readers = readers
        self._read_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._read_pool_lock = threading.Lock()
        self.root = Path(root)
        self._root = str(self.root)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.compression = compression
        self.level = level
        self._index = FileIndex(capacity_bytes, policy)
        self._metrics = TierMetrics(name, self._gauges)
        self._incidents = IncidentLogger(log)
        try:
            (self.root / chunkfile.TMP_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"file tier cannot create {str(self.root)!r}: {exc}") from None
        chunkfile.clean_tmp(self.root / chunkfile.TMP_DIR)
        self._scan()
        self._writer = BackgroundWriter(
            name,
            self._write_jobs,
            max_chunks=queue_depth + 1,  # ``queue`` waiting, plus the one being written
            max_bytes=queue_bytes,
            max_batch=1,
            on_crash=self._crashed,
        )

    @classmethod
    def from_url(
        cls, url: TierURL, name: str = "file", trust: ChunkTrust | None = None
    ) -> FileTier:
        o = parse_file_url(url)
        return cls(
            o.root, o.capacity_bytes, fsync=o.fsync, queue_depth=o.queue_depth,
            queue_bytes=o.queue_bytes, compression=o.compression, level=o.level, policy=o.policy,
            name=name, trust=trust, readers=o.readers,
        )  # fmt: skip

    def _path(self, key: ChunkKey) -> str:
        hexkey = key.hex()  # a plain string: pathlib costs more than the read of a small chunk
        return f"{self._root}/{hexkey[:2]}/{hexkey}{chunkfile.SUFFIX}"

    # -- reads -----------------------------------------------------------------------------
    def contains(self, key: ChunkKey) -> bool:
        if key in self._index or self._writer.pending(key):
            return True
        if self._writer.is_cancelled(key):  # removed while being written: its file is going
            return False
        path = self._path(key)  # written by another process sharing the directory?
        return self._index.adopt(key, lambda: _file_size(path))

    def contains_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Like :meth:`contains`, but looks on disk only until the first absent key: a prefix
        lookup ends there, and probing the rest would cost a ``stat`` per key."""
        found: list[bool] = []
        probing = True
        for key in keys:
            hit = (
                key in self._index or self._writer.pending(key) or (probing and self.contains(key))
            )
            probing = probing and hit
            found.append(hit)
        return found

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        start = time.perf_counter()
        queued = self._writer.queued_chunk(key)
        if queued is not None:  # not written yet: serve it from the queue
            self._metrics.hit(queued.numel() * queued.element_size(), time.perf_counter() - start)
            return queued.clone()
        if self._writer.is_cancelled(key):
            self._metrics.miss()
            return None
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                header = chunkfile.read_header(f, key, self.trust.max_chunk_bytes)
                out = torch.empty(header.shape, dtype=torch_dtype(header.dtype))
                chunkfile.read_payload_into(f, header, byte_view(out), self.trust.sealer)
        except (OSError, ChunkFormatError) as exc:
            self._read_failed(key, exc)
            return None
        self._read_ok(key, header.stored_bytes, start)
        return out

    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        start = time.perf_counter()
        queued = self._writer.queued_chunk(key)
        if queued is not None:  # not written yet: serve it from the queue
            if queued.dtype != out.dtype or queued.shape != out.shape:
                self._metrics.miss()
                return False
            out.copy_(queued)
            self._metrics.hit(queued.numel() * queued.element_size(), time.perf_counter() - start)
            return True
        if self._writer.is_cancelled(key):
            self._metrics.miss()
            return False
        direct = out.is_contiguous() and out.device.type == "cpu"
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                header = chunkfile.read_header(f, key, self.trust.max_chunk_bytes)
                if header.dtype != dtype_name(out.dtype) or header.shape != tuple(out.shape):
                    self._metrics.miss()  # another layout under the same key: not ours
                    return False
                target = out if direct else torch.empty(out.shape, dtype=out.dtype)
                chunkfile.read_payload_into(f, header, byte_view(target), self.trust.sealer)
        except (OSError, ChunkFormatError) as exc:
            self._read_failed(key, exc)
            return False
        if not direct:
            out.copy_(target)
        self._read_ok(key, header.stored_bytes, start)
        return True

    def get_many_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} output buffers")
        if self.readers <= 1 or len(keys) <= 1:
            return [self.get_into(k, o) for k, o in zip(keys, outs, strict=True)]
        # The buffers may be inference tensors (vLLM's worker makes its staging buffers in
        # inference mode), which only code in inference mode may write: read in the caller's.
        inference = torch.is_inference_mode_enabled()

        def read(key: ChunkKey, out: torch.Tensor) -> bool:
            with torch.inference_mode(inference):
                return self.get_into(key, out)

        return list(self._readers().map(read, keys, outs))

    def _readers(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._read_pool_lock:
            if self._read_pool is None:  # started on first use, on the background CPUs
                self._read_pool = concurrent.futures.ThreadPoolExecutor(
                    self.readers, f"{self.name}-read", initializer=enter_background
                )
            return self._read_pool

    def _read_ok(self, key: ChunkKey, stored_bytes: int, start: float) -> None:
        path = self._path(key)  # adopt only a file that is still there (not evicted meanwhile)
        self._index.adopt(key, lambda: _file_size(path))
        self._metrics.hit(stored_bytes, time.perf_counter() - start)

    def _read_failed(self, key: ChunkKey, exc: OSError | ChunkFormatError) -> None:
        self._metrics.miss()
        if isinstance(exc, FileNotFoundError):
            self._index.forget(key)  # evicted by another process, or removed by hand
        elif isinstance(exc, ChunkFormatError):
            self._drop_corrupt(key, exc)
        else:
            self._metrics.error("get")
            self._incidents.warning(
                "read", "file tier %s: reading chunk %s failed: %s", self.name, key.hex(), exc
            )

    def _drop_corrupt(self, key: ChunkKey, exc: ChunkFormatError) -> None:
        self._incidents.warning(
            exc.reason, "file tier %s: dropping chunk %s (%s): %s",
            self.name, key.hex(), exc.reason, exc,
        )  # fmt: skip
        self._metrics.corrupt(exc.reason)
        _unlink(self._path(key))
        if self._index.forget(key):
            self._emit(TierEvent("removed", self.name, key, reason="corrupt"))

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        dtype = dtype_name(chunk.dtype)
        if dtype not in DTYPES:
            raise ValueError(
                f"file tier cannot store dtype {dtype}; supported: {', '.join(DTYPES)}"
            )
        if key in self._index or self._writer.pending(key):
            return True
        if not chunk.is_contiguous() or chunk.device.type != "cpu":
            chunk = chunk.detach().to("cpu").contiguous()  # the queue needs CPU bytes
        if not self._writer.submit(key, chunk):
            self._metrics.dropped()
            return False
        return True

    def _write_jobs(self, jobs: list[WriteJob]) -> None:
        for key, chunk in jobs:
            self._write(key, chunk)

    def _write(self, key: ChunkKey, chunk: torch.Tensor) -> None:
        """On the writer thread (the only thread that writes or evicts files)."""
        start = time.perf_counter()
        if key in self._index:
            return
        raw = byte_view(chunk)
        stored = compress(raw, self.compression, self.level)
        size = HEADER_BYTES + len(stored)
        if size > self.capacity_bytes or not self._evict_for(size):
            self._metrics.dropped()
            return
        dtype, shape = dtype_name(chunk.dtype), tuple(chunk.shape)

        def header_for(checksum: int, seal: SealFields | None) -> bytes:
            return encode_header(
                key, dtype, shape, stored, len(raw), self.compression, checksum, seal
            )

        tmp = chunkfile.temp_path(self.root, key)
        try:
            final = Path(self._path(key))
            chunkfile.write_chunk_file(
                final, tmp, stored, header_for, fsync=self.fsync, sealer=self.trust.sealer, key=key
            )
        except OSError as exc:
            self._write_failed(size, exc)
            return
        except BaseException:
            self._index.release(size)
            raise
        if not self._index.commit(
            key, size, lambda: self._writer.is_cancelled(key), lambda k: _unlink(self._path(k))
        ):
            return  # removed while being written
        self._metrics.wrote(size, time.perf_counter() - start)
        self._emit(TierEvent("stored", self.name, key))

    def _write_failed(self, size: int, exc: OSError) -> None:
        self._index.release(size)
        kind = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "write error"
        self._incidents.warning(
            kind, "file tier %s: %s, chunk not stored: %s", self.name, kind, exc
        )
        self._metrics.dropped()
        self._metrics.error("put")

    def _crashed(self, key: ChunkKey) -> None:
        self._metrics.dropped()
        self._metrics.error("put")

    def _evict_for(self, size: int) -> bool:
        """Evict until ``size`` more bytes fit, then reserve them. False if that is impossible."""
        fits, victims = self._index.reserve(size, lambda k: _unlink(self._path(k)))
        for key in victims:
            self._metrics.evicted()
            self._emit(TierEvent("removed", self.name, key, reason="evicted"))
        return fits

    def remove(self, key: ChunkKey) -> bool:
        with self._index.locked():  # ordered with the writer's commit of the same key
            queued = self._writer.pending(key)
            writing = self._writer.cancel(key) is CancelOutcome.WRITING
            indexed = key in self._index
        existed = queued
        # A write in flight deletes its own file when it commits, or keeps it if the chunk is
        # put again meanwhile: unlinking it here would leave that second put without a file.
        if indexed or not writing:
            try:
                os.unlink(self._path(key))
                existed = True
            except FileNotFoundError:
                pass
        forgot = self._index.forget(key)
        if existed or forgot:
            self._emit(TierEvent("removed", self.name, key, reason="removed"))
        return existed or forgot

    # -- lifecycle and bookkeeping ---------------------------------------------------------
    def _scan(self) -> None:
        """Rebuild the index from the directory; drop bad files; shrink to the budget."""
        found, foreign = chunkfile.scan_chunks(self.root)
        for chunk in found:
            path = self._path(chunk.key)
            try:
                size = chunkfile.check_chunk_file(path, chunk.key, self.trust.sealer)
            except ChunkFormatError as exc:
                self._drop_corrupt(chunk.key, exc)
                continue
            except OSError:
                continue
            self._index.seen(chunk.key, size)
        if found or foreign:
            entries, used = self._index.usage()
            log.info(
                "file tier %s: %d chunks (%d bytes) found in %s; %d other files ignored",
                self.name, entries, used, self.root, len(foreign),
            )  # fmt: skip
        self._evict_for(0)  # the budget may have been lowered since the last run

    def flush(self, timeout_s: float | None = None) -> bool:
        return self._writer.flush(timeout_s)

    def drop_queued(self) -> int:
        return self._writer.drop_queued()

    def close(self) -> None:
        self._writer.close(timeout_s=None)  # a local disk: write everything queued
        with self._read_pool_lock:
            pool, self._read_pool = self._read_pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _gauges(self) -> tuple[int, int]:
        return self._index.usage()

    def keys(self) -> Iterator[ChunkKey]:
        """The keys indexed now (a snapshot), for full syncs with the cluster index."""
        return iter(list(self._index.snapshot()))

    def stats(self) -> TierStats:
        queued = self._writer.state()
        stats = self._metrics.snapshot(*self._index.usage(), self.capacity_bytes)
        stats.extra["queued_writes"] = float(queued.waiting)
        stats.extra["queued_bytes"] = float(queued.waiting_bytes)
        return stats

    def check_integrity(self) -> None:
        self.flush()
        self._index.check()
        index = self._index.snapshot()
        missing = [k for k in index if not os.path.exists(self._path(k))]
        assert not missing, f"{len(missing)} indexed chunks missing on disk"
        mine = f".{os.getpid()}."
        tmp = [e.name for e in os.scandir(self.root / chunkfile.TMP_DIR) if mine in e.name]
        assert not tmp, f"temporary files left behind: {tmp}"


def _file_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
