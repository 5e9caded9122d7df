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
from kvstack.kv.tiers.base import TierEvent, TierURL
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
from kvstack.kv.tiers.remote.queued import QueuedRemoteTier, WriteQueueLimits
from kvstack.kv.tiers.s3 import s3_io
from kvstack.kv.tiers.s3.s3_url import S3Options, parse_s3_url
from kvstack.kv.tiers.writer import WriteJob
from kvstack.kv.trust import ChunkTrust
from kvstack.log import IncidentLogger

__all__ = ["S3Tier"]

log = logging.getLogger(__name__)
R = TypeVar("R")
T = TypeVar("T")


class S3Tier(QueuedRemoteTier):
    scheme = "s3"

    def __init__(
        self, options: S3Options, name: str = "s3", trust: ChunkTrust | None = None
    ) -> None:
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
        self._incidents = IncidentLogger(log)
        self._keys_pool = ThreadPoolExecutor(
            options.threads, f"kvstack-{name}-get", enter_background
        )
        self._range_pool = ThreadPoolExecutor(
            options.threads, f"kvstack-{name}-range", enter_background
        )
        self._known = KnownKeys()
        self._bucket_checked = not options.create_bucket
        super().__init__(
            name,
            CircuitBreaker(name, options.breaker_failures, options.breaker_reset_s),
            WriteQueueLimits(options.queue_chunks, options.queue_bytes, 1, min(options.threads, 4)),
            trust,
        )

    @classmethod
    def from_url(cls, url: TierURL, name: str = "s3", trust: ChunkTrust | None = None) -> S3Tier:
        return cls(parse_s3_url(url), name=name, trust=trust)

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

    # -- reads (queued chunks are served by the base class) ---------------------------------
    def _known_stored(self, key: ChunkKey) -> bool:
        return key in self._known

    def _contains_remote(self, keys: Sequence[ChunkKey]) -> list[bool]:
        return self._each("contains", keys, self._head) or []

    def _head(self, key: ChunkKey) -> bool:
        try:
            self._client.head_object(Bucket=self.options.bucket, Key=self._name(key))
        except self._failures as exc:
            if s3_io.is_missing(exc) and self._bucket_checked:
                return False
            raise
        self._known.add(key)
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
            self._drop_corrupt(key, exc)
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
        header = check_header(head, key, self.trust)
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
        decode_payload(header, target, tensor, self.trust)
        self._known.add(key)
        return tensor

    def _drop_corrupt(self, key: ChunkKey, exc: ChunkFormatError) -> None:
        self._incidents.warning(
            exc.reason, "s3 tier %s: dropping chunk %s (%s): %s",
            self.name, key.hex(), exc.reason, exc,
        )  # fmt: skip
        self._metrics.corrupt(exc.reason)
        self._known.discard(key)
        self._client.delete_object(Bucket=self.options.bucket, Key=self._name(key))
        self._emit(TierEvent("removed", self.name, key, reason="corrupt"))

    # -- writes (queued by the base class) -------------------------------------------------
    def _write_jobs(self, jobs: list[WriteJob]) -> None:
        written = self._each("put", jobs, self._write_one)
        self._settle_writes([job.key for job in jobs], written or [False] * len(jobs))

    def _write_one(self, job: WriteJob) -> bool:
        key, chunk = job
        if key in self._known or self._head(key):
            return True
        start = time.perf_counter()
        encoded = encode_chunk(key, chunk, self.options.compression, self.trust)
        s3_io.upload(
            self._client, self.options.bucket, self._name(key), encoded,
            self.options.multipart_threshold, self.options.part_bytes,
        )  # fmt: skip
        self._metrics.wrote(encoded.num_bytes)
        self._metrics.put_seconds.observe(time.perf_counter() - start)
        self._known.add(key)
        return True

    def _delete_stored(self, keys: Sequence[ChunkKey]) -> bool:
        return any(self._each("remove", keys, self._delete) or [])

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

    def close(self) -> None:
        self._writer.close()
        self._keys_pool.shutdown(wait=True)
        self._range_pool.shutdown(wait=True)
