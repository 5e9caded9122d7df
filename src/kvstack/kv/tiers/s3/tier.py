"""``s3://bucket/prefix`` — chunks as objects in S3 or any S3-compatible store (MinIO, Ceph…).

One object per chunk, ``<prefix>/<key hex>``, in the chunk format (checksum verified on every
read; a corrupt object is deleted and is a miss). Batched calls run in parallel on a thread
pool; large objects are read as parallel ranged GETs straight into the caller's tensor and
written as multipart uploads. Writes go through a bounded background queue (``put`` never
waits on the network) and skip objects that already exist. botocore's own payload checksums are
turned off (``when_required``): the chunk format's XXH3 already covers the bytes end to end. A
failing endpoint opens a circuit breaker (calls become misses, retried every
``breaker_reset_s``). URL parameters: see :mod:`kvstack.kv.tiers.s3.s3_url`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvstack.errors import ChunkFormatError, TierError, require
from kvstack.kv.affinity import enter_background
from kvstack.kv.keys import KEY_BYTES, ChunkKey
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.base import Tier, TierEvent, TierStats, TierURL
from kvstack.kv.tiers.metrics import TierMetrics
from kvstack.kv.tiers.remote.breaker import CircuitBreaker
from kvstack.kv.tiers.remote.codec import (
    HEADER_BYTES,
    check_header,
    decode_payload,
    encode_chunk,
    fits,
    payload_target,
    tensor_for,
)
from kvstack.kv.tiers.remote.known import KnownKeys
from kvstack.kv.tiers.remote.writer import BackgroundWriter, WriteJob
from kvstack.kv.tiers.s3 import s3_io
from kvstack.kv.tiers.s3.s3_url import S3Options, parse_s3_url
from kvstack.log import IncidentLogger

__all__ = ["S3Tier"]

log = logging.getLogger(__name__)
R = TypeVar("R")
T = TypeVar("T")


class S3Tier(Tier):
    scheme = "s3"
    shared = True

    def __init__(self, options: S3Options, name: str = "s3") -> None:
        super().__init__(name)
        self.options = options
        self.location = options.location
        self._client = s3_io.make_client(options)
        botocore_exceptions = require("botocore.exceptions", "s3")
        self._failures: tuple[type[BaseException], ...] = (
            botocore_exceptions.BotoCoreError,  # type: ignore[attr-defined]
            botocore_exceptions.ClientError,  # type: ignore[attr-defined]
            OSError,
            TierError,
        )
        self._breaker = CircuitBreaker(name, options.breaker_failures, options.breaker_reset_s)
        self._metrics = TierMetrics(name)
        self._incidents = IncidentLogger(log)
        self._keys_pool = ThreadPoolExecutor(
            options.threads, f"kvstack-{name}-get", enter_background
        )
        self._range_pool = ThreadPoolExecutor(
            options.threads, f"kvstack-{name}-range", enter_background
        )
        self._known = KnownKeys()
        self._bucket_checked = not options.create_bucket
        self._writer = BackgroundWriter(
            name,
            self._write_jobs,
            max_chunks=options.queue_chunks,
            max_bytes=options.queue_bytes,
            max_batch=1,
            num_threads=min(options.threads, 4),
        )

    @classmethod
    def from_url(cls, url: TierURL, name: str = "s3") -> S3Tier:
        return cls(parse_s3_url(url), name=name)

    def _name(self, key: ChunkKey) -> str:
        return self.options.object_key(key.hex())

    # -- the network, behind the breaker ---------------------------------------------------
    def _each(self, op: str, items: Sequence[T], call: Callable[[T], R]) -> list[R] | None:
        """``call(item)`` for every item, in parallel; None if the breaker is open or any call
        failed (the breaker counts it)."""
        if not items or not self._breaker.allow():
            return None
        try:
            self._ensure_bucket()
            results = list(self._keys_pool.map(call, items))
        except self._failures as exc:
            self._failed(op, exc)
            return None
        self._breaker.success()
        return results

    def _failed(self, op: str, exc: BaseException) -> None:
        if s3_io.is_missing(exc):  # a whole-bucket 404 is a failure, not a miss
            exc = TierError(f"bucket {self.options.bucket!r} does not exist")
        self._bucket_checked = not self.options.create_bucket  # recheck after an incident
        self._metrics.error(op)
        self._breaker.failure(exc)
        self._incidents.warning(
            f"{op}:{type(exc).__name__}", "s3 tier %s: %s failed: %r", self.name, op, exc
        )

    def _ensure_bucket(self) -> None:
        if self._bucket_checked:
            return
        try:
            self._client.head_bucket(Bucket=self.options.bucket)
        except self._failures as exc:
            if not s3_io.is_missing(exc):
                raise
            self._client.create_bucket(Bucket=self.options.bucket)
        self._bucket_checked = True

    # -- reads -----------------------------------------------------------------------------
    def contains(self, key: ChunkKey) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        found = [k in self._known or self._writer.queued_chunk(k) is not None for k in keys]
        todo = [keys[i] for i, hit in enumerate(found) if not hit]
        heads = self._each("contains", todo, self._head) or []
        present = iter(heads)
        for i, hit in enumerate(found):
            if not hit:
                found[i] = next(present, False)
        return found

    def _head(self, key: ChunkKey) -> bool:
        try:
            self._client.head_object(Bucket=self.options.bucket, Key=self._name(key))
        except self._failures as exc:
            if s3_io.is_missing(exc) and self._bucket_checked:
                return False
            raise
        self._known.add(key)
        return True

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        queued = self._writer.queued_chunk(key)
        if queued is not None:
            self._metrics.hit(queued.numel() * queued.element_size())
            return queued
        return self._read([key], [None])[0]

    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        return self.get_many_into([key], [out])[0]

    def get_many_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        loaded = [self._copy_queued(k, o) for k, o in zip(keys, outs, strict=True)]
        todo = [i for i, hit in enumerate(loaded) if not hit]
        got = self._read([keys[i] for i in todo], [outs[i] for i in todo])
        for i, chunk in zip(todo, got, strict=True):
            loaded[i] = chunk is not None
        return loaded

    def _copy_queued(self, key: ChunkKey, out: torch.Tensor) -> bool:
        queued = self._writer.queued_chunk(key)
        if queued is None or queued.dtype != out.dtype or queued.shape != out.shape:
            return False
        out.copy_(queued)
        self._metrics.hit(queued.numel() * queued.element_size())
        return True

    def _read(
        self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        start = time.perf_counter()
        pairs = list(zip(keys, outs, strict=True))
        results = self._each("get", pairs, lambda pair: self._read_one(*pair))
        chunks = results or [None] * len(keys)
        for chunk in chunks:
            if chunk is None:
                self._metrics.miss()
            else:
                self._metrics.hit(chunk.numel() * chunk.element_size())
        if any(c is not None for c in chunks):
            self._metrics.get_seconds.observe(time.perf_counter() - start)
        return chunks

    def _read_one(self, key: ChunkKey, out: torch.Tensor | None) -> torch.Tensor | None:
        name, part = self._name(key), s3_io.first_part_bytes(self.options.part_bytes)
        try:
            response = self._client.get_object(
                Bucket=self.options.bucket, Key=name, Range=f"bytes=0-{part - 1}"
            )
        except self._failures as exc:
            if s3_io.is_missing(exc) and self._bucket_checked:
                self._known.discard(key)
                return None
            raise
        body = response["Body"]
        try:
            return self._receive(key, body, s3_io.total_size(response), out)
        except ChunkFormatError as exc:
            self._drop_corrupt(key, str(exc))
            return None
        finally:
            body.close()

    def _receive(
        self, key: ChunkKey, body: Any, total: int, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        head = bytearray(HEADER_BYTES)
        if total < HEADER_BYTES:
            raise ChunkFormatError(f"object of {total} bytes is shorter than a chunk header")
        s3_io.read_body_into(body, memoryview(head))
        header = check_header(head, key)
        if header.stored_bytes != total - HEADER_BYTES:
            raise ChunkFormatError(f"object is {total} bytes, header says {header.stored_bytes}")
        tensor = tensor_for(header) if out is None else out
        if not fits(header, tensor):
            return None
        target = payload_target(header, tensor)
        first = min(total, s3_io.first_part_bytes(self.options.part_bytes)) - HEADER_BYTES
        s3_io.read_body_into(body, target.view[:first])
        s3_io.ranged_read(
            self._client, self.options.bucket, self._name(key), target.view[first:],
            HEADER_BYTES + first, self.options.part_bytes, self._range_pool,
        )  # fmt: skip
        decode_payload(header, target, tensor)
        self._known.add(key)
        return tensor

    def _drop_corrupt(self, key: ChunkKey, detail: str) -> None:
        self._incidents.warning(
            "corrupt", "s3 tier %s: dropping corrupt chunk %s: %s", self.name, key.hex(), detail
        )
        self._metrics.corrupt()
        self._known.discard(key)
        self._client.delete_object(Bucket=self.options.bucket, Key=self._name(key))
        self._emit(TierEvent("removed", self.name, key, reason="corrupt"))

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        if self._breaker.state == "open" or not self._writer.submit(key, chunk):
            self._metrics.dropped()
            return False
        return True

    def _write_jobs(self, jobs: list[WriteJob]) -> None:
        written = self._each("put", jobs, self._write_one)
        for job, ok in zip(jobs, written or [False] * len(jobs), strict=True):
            if ok:
                self._emit(TierEvent("stored", self.name, job.key))
            else:
                self._metrics.dropped()

    def _write_one(self, job: WriteJob) -> bool:
        key, chunk = job
        if key in self._known or self._head(key):
            return True
        start = time.perf_counter()
        encoded = encode_chunk(key, chunk, self.options.compression)
        s3_io.upload(
            self._client, self.options.bucket, self._name(key), encoded,
            self.options.multipart_threshold, self.options.part_bytes,
        )  # fmt: skip
        self._metrics.wrote(encoded.num_bytes)
        self._metrics.put_seconds.observe(time.perf_counter() - start)
        self._known.add(key)
        return True

    def remove(self, key: ChunkKey) -> bool:
        queued = self._writer.discard(key)
        existed = (self._each("remove", [key], self._delete) or [False])[0]
        if queued or existed:
            self._emit(TierEvent("removed", self.name, key, reason="removed"))
        return queued or existed

    def _delete(self, key: ChunkKey) -> bool:
        existed = self._head(key)
        self._known.discard(key)
        if existed:
            self._client.delete_object(Bucket=self.options.bucket, Key=self._name(key))
        return existed

    # -- listing, lifecycle ----------------------------------------------------------------
    def keys(self) -> Iterator[ChunkKey]:
        """Every chunk key under the prefix (ListObjectsV2), for full syncs."""
        prefix = self.options.object_key("")
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.options.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                hex_key = item["Key"][len(prefix) :]
                if len(hex_key) == 2 * KEY_BYTES:
                    try:
                        yield ChunkKey(bytes.fromhex(hex_key))
                    except ValueError:
                        continue

    def flush(self, timeout_s: float | None = None) -> bool:
        return self._writer.flush(timeout_s)

    def close(self) -> None:
        self._writer.close()
        self._keys_pool.shutdown(wait=True)
        self._range_pool.shutdown(wait=True)

    def stats(self) -> TierStats:
        stats = self._metrics.snapshot(0, 0, 0)
        stats.extra["queued_writes"] = float(self._writer.num_queued)
        stats.extra["breaker_trips"] = float(self._breaker.trips)
        stats.extra["breaker_open"] = float(self._breaker.state != "closed")
        return stats
