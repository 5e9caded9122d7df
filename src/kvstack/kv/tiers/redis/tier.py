"""``redis://host:6379/0`` (also ``rediss://``, Valkey, Redis Cluster) — chunks in Redis.

Each chunk is one value ``<prefix><key hex>`` in the chunk format (header + payload, checksum
verified on every read; a corrupt value is deleted and is a miss). Calls are batched: one
pipeline of ``EXISTS`` or ``GET`` per node and call, and reads land straight in the caller's
tensors (see :mod:`kvstack.kv.tiers.redis.resp` for why not redis-py's reply parser). Writes go
through a bounded background queue (``put`` never waits on the network) that skips values
already stored (renewing their TTL) and pipelines the rest. A failing server opens a circuit
breaker: calls become misses at once and are retried every ``breaker_reset_s``.

URL parameters: see :mod:`kvstack.kv.tiers.redis.redis_url`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvstack.errors import TierError
from kvstack.kv.affinity import enter_background
from kvstack.kv.keys import KEY_BYTES, ChunkKey
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.base import TierEvent, TierURL
from kvstack.kv.tiers.redis import redis_io
from kvstack.kv.tiers.redis.redis_nodes import NodeAddress, RedisNodes
from kvstack.kv.tiers.redis.redis_url import RedisOptions, parse_redis_url
from kvstack.kv.tiers.redis.resp import RespConnection, pack_command
from kvstack.kv.tiers.remote.breaker import CircuitBreaker
from kvstack.kv.tiers.remote.codec import ReadResult, encode_chunk
from kvstack.kv.tiers.remote.queued import QueuedRemoteTier, WriteQueueLimits
from kvstack.kv.tiers.writer import WriteJob
from kvstack.kv.trust import ChunkTrust
from kvstack.log import IncidentLogger

__all__ = ["RedisTier"]

log = logging.getLogger(__name__)
R = TypeVar("R")
# Network, server and protocol failures; anything else is a bug and reaches the cache.
FAILURES = (OSError, TierError)


class RedisTier(QueuedRemoteTier):
    scheme = "redis"

    def __init__(
        self, options: RedisOptions, name: str = "redis", trust: ChunkTrust | None = None
    ) -> None:
        self.options = options
        self.location = options.location
        self._prefix = options.prefix.encode()
        self._nodes = RedisNodes(options.seeds, options.settings, options.cluster)
        self._incidents = IncidentLogger(log)
        self._pool = ThreadPoolExecutor(8, f"kvstack-{name}-io", enter_background)
        self._verify = ThreadPoolExecutor(2, f"kvstack-{name}-verify", enter_background)
        super().__init__(
            name,
            CircuitBreaker(name, options.breaker_failures, options.breaker_reset_s),
            WriteQueueLimits(options.queue_chunks, options.queue_bytes, options.write_batch),
            trust,
        )

    @classmethod
    def from_url(
        cls, url: TierURL, name: str = "redis", trust: ChunkTrust | None = None
    ) -> RedisTier:
        return cls(parse_redis_url(url), name=name, trust=trust)

    def _name(self, key: ChunkKey) -> bytes:
        return self._prefix + key.hex().encode()

    # -- the network, per node, behind the breaker -----------------------------------------
    def _per_node(
        self, op: str, names: Sequence[bytes], call: Callable[[RespConnection, list[int]], list[R]]
    ) -> list[R] | None:
        """Run ``call(conn, indices)`` on each node owning some of ``names`` (in parallel when
        there are several); its results, one per name, in order. None if the breaker is open
        or a node failed."""
        if not names or not self._breaker.allow():
            return None
        try:
            groups = self._nodes.group(names)
            if len(groups) == 1:  # one node: no thread hop
                ((address, indices),) = groups.items()
                return self._succeeded(self._on_node(address, call, indices))
            futures = [
                (indices, self._pool.submit(self._on_node, address, call, indices))
                for address, indices in groups.items()
            ]
            results: list[Any] = [None] * len(names)
            for indices, future in futures:
                for i, result in zip(indices, future.result(), strict=True):
                    results[i] = result
        except FAILURES as exc:
            self._failed(op, exc)
            return None
        return self._succeeded(results)

    def _succeeded(self, results: list[R]) -> list[R]:
        self._breaker.success()
        return results

    def _on_node(
        self,
        address: NodeAddress,
        call: Callable[[RespConnection, list[int]], list[R]],
        idx: list[int],
    ) -> list[R]:
        with self._nodes.pool(address).connection() as conn:
            return call(conn, idx)

    def _failed(self, op: str, exc: BaseException) -> None:
        self._metrics.error(op)
        self._breaker.failure(exc)
        self._incidents.warning(
            f"{op}:{type(exc).__name__}", "redis tier %s: %s failed: %r", self.name, op, exc
        )

    # -- reads (queued chunks are served by the base class) ---------------------------------
    def _contains_remote(self, keys: Sequence[ChunkKey]) -> list[bool]:
        names = [self._name(k) for k in keys]

        def exists(conn: RespConnection, idx: list[int]) -> list[bool]:
            return redis_io.exists_batch(conn, [names[i] for i in idx])

        return self._per_node("contains", names, exists) or []

    def _read(
        self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        start = time.perf_counter()
        names = [self._name(k) for k in keys]

        def read(conn: RespConnection, idx: list[int]) -> list[ReadResult]:
            picked_keys, picked_outs = [keys[i] for i in idx], [outs[i] for i in idx]
            picked_names = [names[i] for i in idx]
            return redis_io.read_batch(
                conn, picked_names, picked_keys, picked_outs, self._verify, self.trust
            )

        results = self._per_node("get", names, read)
        if results is None:
            for _ in keys:
                self._metrics.miss()
            return [None] * len(keys)
        chunks = [self._account(k, r) for k, r in zip(keys, results, strict=True)]
        if any(c is not None for c in chunks):
            self._metrics.get_seconds.observe(time.perf_counter() - start)
        return chunks

    def _account(self, key: ChunkKey, result: ReadResult) -> torch.Tensor | None:
        if result.outcome == "hit" and result.chunk is not None:
            self._metrics.hit(result.chunk.numel() * result.chunk.element_size())
            return result.chunk
        self._metrics.miss()
        if result.outcome == "moved":
            self._nodes.moved()
        elif result.outcome == "corrupt":
            self._drop_corrupt(key, result.detail, result.reason)
        return None

    def _drop_corrupt(self, key: ChunkKey, detail: str, reason: str) -> None:
        self._incidents.warning(
            reason, "redis tier %s: dropping chunk %s (%s): %s",
            self.name, key.hex(), reason, detail,
        )  # fmt: skip
        self._metrics.corrupt(reason)
        self._delete_stored([key])
        self._emit(TierEvent("removed", self.name, key, reason="corrupt"))

    # -- writes (queued by the base class) -------------------------------------------------
    def _write_jobs(self, jobs: list[WriteJob]) -> None:
        keys = [job.key for job in jobs]
        names = [self._name(k) for k in keys]

        def write(conn: RespConnection, idx: list[int]) -> list[bool]:
            present = redis_io.exists_batch(conn, [names[i] for i in idx])
            stored = [i for i, p in zip(idx, present, strict=True) if p]
            if stored and self.options.ttl_ms > 0:
                redis_io.touch_batch(conn, [names[i] for i in stored], self.options.ttl_ms)
            todo = [i for i, p in zip(idx, present, strict=True) if not p]
            acks = self._set(conn, [jobs[i] for i in todo], [names[i] for i in todo])
            done = dict(zip(todo, acks, strict=True))
            return [done.get(i, True) for i in idx]

        results = self._per_node("put", names, write)
        self._settle_writes(keys, results or [False] * len(keys))

    def _set(self, conn: RespConnection, jobs: list[WriteJob], names: list[bytes]) -> list[bool]:
        start = time.perf_counter()
        compression = self.options.compression
        encoded = [encode_chunk(job.key, job.chunk, compression, self.trust) for job in jobs]
        acks = redis_io.write_batch(conn, names, encoded, self.options.ttl_ms)
        if jobs:
            self._metrics.put_seconds.observe((time.perf_counter() - start) / len(jobs))
        for enc, ok in zip(encoded, acks, strict=True):
            if ok:
                self._metrics.wrote(enc.num_bytes)
        return acks

    def _delete_stored(self, keys: Sequence[ChunkKey]) -> bool:
        names = [self._name(k) for k in keys]

        def delete(conn: RespConnection, idx: list[int]) -> list[bool]:
            return redis_io.delete_batch(conn, [names[i] for i in idx])

        deleted: list[bool] = self._per_node("remove", names, delete) or []
        return any(deleted)

    # -- listing, lifecycle ----------------------------------------------------------------
    def keys(self) -> Iterator[ChunkKey]:
        """Every chunk key under this tier's prefix (SCAN on each master), for full syncs."""
        pattern = _glob_escape(self.options.prefix) + "*"
        for address in self._nodes.masters():
            with self._nodes.pool(address).connection() as conn:
                cursor: Any = b"0"
                while True:
                    (reply,) = conn.pipeline(
                        [pack_command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)]
                    )
                    if not isinstance(reply, list) or len(reply) != 2:
                        raise TierError(f"unexpected SCAN reply from redis: {reply!r}")
                    cursor, names = reply
                    yield from self._keys_of(names)
                    if cursor == b"0":
                        break

    def _keys_of(self, names: Any) -> Iterator[ChunkKey]:
        for name in names:
            if isinstance(name, bytes) and len(name) == len(self._prefix) + 2 * KEY_BYTES:
                try:
                    yield ChunkKey(bytes.fromhex(name[len(self._prefix) :].decode()))
                except ValueError:
                    continue

    def close(self) -> None:
        self._writer.close()
        self._pool.shutdown(wait=True)
        self._verify.shutdown(wait=True)
        self._nodes.close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
