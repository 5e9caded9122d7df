"""KVCache: the tiered, content-addressed KV chunk store.

Tiers are ordered fastest first (``cpu://`` → ``file://`` → ``redis://`` | ``s3://`` | ``peer://``).

- **Writes**: write-through by default (every tier gets the chunk; the first in-memory tier copies
  it once and the slower tiers write that copy in the background), or write-back (first tier
  only; evictions are demoted to the next tier instead of dropped). An optional admission
  threshold stores a chunk only once it was requested that many times.
- **Reads**: each chunk comes from the fastest tier holding it, and a hit in a slower tier is
  promoted into the faster ones. A lookup returns the contiguous prefix only: the first missing
  chunk ends the hit.
- **Failures**: an exception from any tier is logged once per incident, counted, and treated as
  a miss (reads) or as not stored (writes). Corrupt data is never returned (tiers verify).

Thread-safe. Typical use::

    cache = KVCache.from_config({"model": "llama-3-8b@abc123", "chunk_size": 256,
                                 "tiers": ["cpu://?size=1GiB", "file:///tmp/kv?size=10GiB"]})
    n = cache.store(token_ids, kv)     # kv: [layers, 2, num_tokens, kv_heads, head_dim]
    n = cache.lookup(token_ids)        # tokens in the longest stored prefix
    kv, n = cache.retrieve(token_ids)  # KV of the first n tokens (None, 0 on a miss)
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvstack.config import load_section, log_config_once
from kvstack.kv.config import KVConfig
from kvstack.kv.format import DTYPES
from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys, chunk_spans
from kvstack.kv.tensors import dtype_name, torch
from kvstack.kv.tiers import Tier, TierEvent, TierStats, make_tier, parse_tier_url
from kvstack.log import IncidentLogger
from kvstack.metrics import counter

__all__ = ["CacheStats", "KVCache"]

log = logging.getLogger(__name__)
T = TypeVar("T")
ADMISSION_TRACKED_KEYS = 1 << 20

_LOOKUP_TOKENS = counter("kvstack_kv_lookup_tokens_total", "Prompt tokens looked up")
_HIT_TOKENS = counter("kvstack_kv_lookup_hit_tokens_total", "Looked-up tokens found stored")
_STORED_TOKENS = counter("kvstack_kv_stored_tokens_total", "Tokens whose chunks were stored")
_REJECTED = counter("kvstack_kv_admission_rejected_total", "Chunks not stored by admission")
_DEMOTED = counter("kvstack_kv_demoted_total", "Evicted chunks demoted to the next tier", ["tier"])
_PROMOTED = counter("kvstack_kv_promoted_total", "Chunks promoted into a faster tier", ["tier"])


@dataclass
class CacheStats:
    tiers: list[TierStats]
    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0
    stored_tokens: int = 0
    retrieved_tokens: int = 0
    admission_rejected: int = 0
    tier_errors: int = 0
    by_tier: dict[str, TierStats] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class KVCache:
    def __init__(self, config: KVConfig, tiers: Sequence[Tier] | None = None) -> None:
        self.config = config
        self.tiers: list[Tier] = (
            list(tiers) if tiers is not None else _tiers_from_urls(config.tiers)
        )
        if not self.tiers:
            raise ValueError("a KVCache needs at least one tier")
        self._lock = threading.Lock()
        self._dtype: str | None = config.kv_dtype
        self._shape: tuple[int, int, int] | None = (
            None
            if config.model_shape is None
            else (
                config.model_shape.num_layers,
                config.model_shape.num_kv_heads,
                config.model_shape.head_dim,
            )
        )
        self._requests: OrderedDict[ChunkKey, int] = OrderedDict()
        self._namespaces: dict[tuple[str, str], bytes] = {}
        self._listeners: list[Callable[[TierEvent], None]] = []
        self._incidents = IncidentLogger(log)
        self._stats = CacheStats(tiers=[])
        for position, tier in enumerate(self.tiers):
            tier.add_listener(functools.partial(self._on_tier_event, position))

    @classmethod
    def from_config(cls, config: KVConfig | Mapping[str, Any] | None = None) -> KVCache:
        """Build from a ``kv`` section: a KVConfig, or a dict merged over the YAML file named by
        ``KVSTACK_CONFIG`` and overridden by ``KVSTACK_KV_*`` environment variables."""
        section = config if isinstance(config, KVConfig) else load_section("kv", KVConfig, config)
        log_config_once("kv", section)
        return cls(section)

    # -- keys ------------------------------------------------------------------------------
    def namespace(self, salt: str | None = None, adapter: str | None = None) -> bytes:
        """The 16-byte seed of the key chain for this model, dtype, TP rank, adapter and salt."""
        slot = (salt or "", adapter or "")
        digest = self._namespaces.get(slot)
        if digest is None:
            c = self.config
            ns = Namespace(
                c.model,
                c.kv_dtype or "auto",
                c.layout_version,
                c.tp_rank,
                c.tp_size,
                slot[1],
                slot[0],
            )
            digest = self._namespaces.setdefault(slot, ns.digest())
        return digest

    def chunk_keys(
        self, tokens: Sequence[int] | Any, salt: str | None = None, adapter: str | None = None
    ) -> list[ChunkKey]:
        return chunk_keys(
            tokens,
            self.namespace(salt, adapter),
            self.config.chunk_size,
            self.config.save_partial_chunks,
        )

    def _spans(self, num_tokens: int) -> list[tuple[int, int]]:
        return chunk_spans(num_tokens, self.config.chunk_size, self.config.save_partial_chunks)

    # -- the token-level API ---------------------------------------------------------------
    def store(
        self,
        tokens: Sequence[int] | Any,
        kv: torch.Tensor,
        salt: str | None = None,
        adapter: str | None = None,
    ) -> int:
        """Store the KV of ``tokens``; returns the length of the stored prefix in tokens.

        ``kv`` is ``[num_layers, 2, len(tokens), num_kv_heads, head_dim]``. Raises ValueError
        (and stores nothing) for a wrong shape or dtype, or non-integer tokens."""
        keys = self.chunk_keys(tokens, salt, adapter)
        self._check_kv(kv, len(tokens))
        spans = self._spans(len(tokens))
        chunks = [kv[:, :, start:end] for start, end in spans]
        stored = self.put_chunks(keys, chunks)
        num = spans[stored - 1][1] if stored else 0
        _STORED_TOKENS.inc(num)
        with self._lock:
            self._stats.stored_tokens += num
        return num

    def lookup(
        self, tokens: Sequence[int] | Any, salt: str | None = None, adapter: str | None = None
    ) -> int:
        """Tokens in the longest stored prefix of ``tokens`` (0 on a miss)."""
        keys = self.chunk_keys(tokens, salt, adapter)
        self._count_requests(keys)
        found = self.contains_prefix(keys)
        num = self._spans(len(tokens))[found - 1][1] if found else 0
        self._record_lookup(len(tokens), num)
        return num

    def retrieve(
        self, tokens: Sequence[int] | Any, salt: str | None = None, adapter: str | None = None
    ) -> tuple[torch.Tensor | None, int]:
        """KV of the longest stored prefix of ``tokens`` and its length; ``None, 0`` on a miss."""
        keys = self.chunk_keys(tokens, salt, adapter)
        self._count_requests(keys)
        chunks: list[torch.Tensor] = []
        for key in keys:
            chunk = self._get_one(key)
            if chunk is None:
                break
            chunks.append(chunk)
        if not chunks:
            return None, 0
        kv = torch.cat(chunks, dim=2)
        with self._lock:
            self._stats.retrieved_tokens += kv.shape[2]
        return kv, int(kv.shape[2])

    # -- the chunk-level API (the connector's) ---------------------------------------------
    def contains_prefix(self, keys: Sequence[ChunkKey]) -> int:
        """How many leading ``keys`` some tier holds."""
        found = [False] * len(keys)
        for tier in self.tiers:
            todo = [i for i, hit in enumerate(found) if not hit]
            if not todo:
                break
            present: list[bool] = self._safe(
                tier, "contains", tier.contains_many, [keys[i] for i in todo], default=[]
            )
            for i, hit in zip(todo, present, strict=False):
                found[i] = hit
        return _leading(found)

    def put_chunks(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor]) -> int:
        """Store chunks (tensors or views; the cache copies what it keeps). Returns how many
        leading chunks are now held by at least one tier."""
        admitted = self._admit(keys)
        held = []
        for key, chunk, admit in zip(keys, chunks, admitted, strict=True):
            held.append(admit and self._put_one(key, chunk))
        return _leading(held)

    def get_chunks_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> int:
        """Load chunks into caller buffers (each of its chunk's exact shape and dtype).
        Returns how many leading chunks were loaded; later buffers are undefined."""
        loaded = [False] * len(keys)
        for position, tier in enumerate(self.tiers):
            todo = [i for i, hit in enumerate(loaded) if not hit]
            if not todo:
                break
            ks, os_ = [keys[i] for i in todo], [outs[i] for i in todo]
            got: list[bool] = self._safe(tier, "get", tier.get_many_into, ks, os_, default=[])
            for i, hit in zip(todo, got, strict=False):
                if hit:
                    loaded[i] = True
                    self._promote(position, keys[i], outs[i])
        return _leading(loaded)

    def add_listener(self, listener: Callable[[TierEvent], None]) -> None:
        """Receive every tier's stored/removed events (KV event streams, index announcements)."""
        self._listeners.append(listener)

    # -- internals -------------------------------------------------------------------------
    def _put_one(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        targets = self.tiers if self.config.write_policy == "write-through" else self.tiers[:1]
        held = False
        shared: torch.Tensor | None = None  # one immutable copy for every non-copying tier
        for tier in targets:
            if tier.put_copies:
                ok = self._safe(tier, "put", tier.put, key, chunk, default=False)
                if ok and shared is None:
                    shared = self._safe(tier, "borrow", tier.borrow, key, default=None)
            else:
                if shared is None:
                    shared = self._private_copy(chunk)
                ok = self._safe(tier, "put", tier.put, key, shared, default=False)
            held = held or ok
        return held

    def _private_copy(self, chunk: torch.Tensor) -> torch.Tensor:
        if chunk.device.type != "cpu":
            return chunk.to("cpu")
        if chunk.is_contiguous():
            return chunk.clone()
        return chunk.contiguous()

    def _get_one(self, key: ChunkKey) -> torch.Tensor | None:
        for position, tier in enumerate(self.tiers):
            chunk = self._safe(tier, "get", tier.get, key, default=None)
            if chunk is not None:
                self._promote(position, key, chunk)
                return chunk
        return None

    def _promote(self, position: int, key: ChunkKey, chunk: torch.Tensor) -> None:
        if not position or not self.config.promote_on_hit:
            return
        private: torch.Tensor | None = None
        for tier in self.tiers[:position]:
            if tier.put_copies:
                ok = self._safe(tier, "put", tier.put, key, chunk, default=False)
            else:
                private = private if private is not None else self._private_copy(chunk)
                ok = self._safe(tier, "put", tier.put, key, private, default=False)
            if ok:
                _PROMOTED.labels(tier.name).inc()

    def _on_tier_event(self, position: int, event: TierEvent) -> None:
        if event.kind == "removed" and event.reason == "evicted" and event.chunk is not None:
            self._demote(position, event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("KV cache event listener failed")

    def _demote(self, position: int, event: TierEvent) -> None:
        if position + 1 >= len(self.tiers):
            return
        nxt = self.tiers[position + 1]
        assert event.chunk is not None
        if self._safe(nxt, "contains", nxt.contains, event.key, default=True):
            return
        if self._safe(nxt, "put", nxt.put, event.key, event.chunk, default=False):
            _DEMOTED.labels(nxt.name).inc()

    def _safe(self, tier: Tier, op: str, call: Callable[..., T], *args: Any, default: T) -> T:
        """Run one tier operation; any failure is counted, logged once per incident, and
        becomes ``default`` (a miss, or not stored)."""
        try:
            return call(*args)
        except Exception as exc:
            with self._lock:
                self._stats.tier_errors += 1
            self._incidents.warning(
                f"{tier.name}:{op}",
                "KV tier %s failed %s (treated as a miss): %r",
                tier.name,
                op,
                exc,
            )
            return default

    def _check_kv(self, kv: Any, num_tokens: int) -> None:
        if not isinstance(kv, torch.Tensor):
            raise ValueError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
        if kv.dim() != 5 or kv.shape[1] != 2:
            raise ValueError(
                "kv must have shape [num_layers, 2, num_tokens, num_kv_heads, head_dim], "
                f"got {list(kv.shape)}"
            )
        if kv.shape[2] != num_tokens:
            raise ValueError(f"kv holds {kv.shape[2]} tokens but {num_tokens} token ids were given")
        dtype = dtype_name(kv.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"unsupported KV dtype {dtype}; supported: {', '.join(DTYPES)}")
        shape = (int(kv.shape[0]), int(kv.shape[3]), int(kv.shape[4]))
        with self._lock:
            want_dtype = self._dtype or dtype
            want_shape = self._shape or shape
            if dtype != want_dtype:
                raise ValueError(f"kv dtype {dtype} does not match the cache's {want_dtype}")
            if shape != want_shape:
                raise ValueError(
                    "kv shape (num_layers, num_kv_heads, head_dim) = "
                    f"{shape} does not match the cache's {want_shape}"
                )
            self._dtype, self._shape = want_dtype, want_shape

    def _count_requests(self, keys: Sequence[ChunkKey]) -> None:
        if self.config.admission_threshold <= 1:
            return
        with self._lock:
            for key in keys:
                self._requests[key] = self._requests.pop(key, 0) + 1
            while len(self._requests) > ADMISSION_TRACKED_KEYS:
                self._requests.popitem(last=False)

    def _admit(self, keys: Sequence[ChunkKey]) -> list[bool]:
        threshold = self.config.admission_threshold
        if threshold <= 1:
            return [True] * len(keys)
        self._count_requests(keys)
        with self._lock:
            admitted = [self._requests.get(k, 0) >= threshold for k in keys]
        rejected = admitted.count(False)
        if rejected:
            _REJECTED.inc(rejected)
            with self._lock:
                self._stats.admission_rejected += rejected
        return admitted

    def _record_lookup(self, num_tokens: int, hit: int) -> None:
        _LOOKUP_TOKENS.inc(num_tokens)
        _HIT_TOKENS.inc(hit)
        with self._lock:
            self._stats.lookups += 1
            self._stats.lookup_tokens += num_tokens
            self._stats.hit_tokens += hit

    # -- bookkeeping -----------------------------------------------------------------------
    def stats(self) -> CacheStats:
        tiers = [tier.stats() for tier in self.tiers]
        with self._lock:
            s = self._stats
            return CacheStats(
                tiers=tiers,
                lookups=s.lookups,
                lookup_tokens=s.lookup_tokens,
                hit_tokens=s.hit_tokens,
                stored_tokens=s.stored_tokens,
                retrieved_tokens=s.retrieved_tokens,
                admission_rejected=s.admission_rejected,
                tier_errors=s.tier_errors,
                by_tier={t.name: t for t in tiers},
            )

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for background writes of every tier."""
        return all(tier.flush(timeout_s) for tier in self.tiers)

    def check_integrity(self) -> None:
        """Raise AssertionError if any tier's bookkeeping is inconsistent."""
        names = [tier.name for tier in self.tiers]
        assert len(set(names)) == len(names), f"duplicate tier names {names}"
        for tier in self.tiers:
            tier.check_integrity()

    def close(self) -> None:
        for tier in self.tiers:
            try:
                tier.flush(timeout_s=30)
                tier.close()
            except Exception:
                log.exception("closing KV tier %s failed", tier.name)

    def __enter__(self) -> KVCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tiers_from_urls(urls: Sequence[str]) -> list[Tier]:
    tiers: list[Tier] = []
    try:
        for url in urls:
            scheme = parse_tier_url(url).scheme
            taken = {t.name for t in tiers}
            name = scheme if scheme not in taken else f"{scheme}{len(tiers)}"
            tiers.append(make_tier(url, name=name))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return tiers


def _leading(flags: Sequence[bool]) -> int:
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)
