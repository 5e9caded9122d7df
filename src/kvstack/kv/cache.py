"""KVCache: the tiered, content-addressed KV chunk store.

Tiers are ordered fastest first (``cpu://`` → ``file://`` → ``redis://`` | ``s3://`` | ``peer://``).

- **Writes**: write-through by default (every tier gets the chunk; the first in-memory tier copies
  it once and the slower tiers write that copy in the background), write-back (first tier only;
  evictions are demoted to the next tier instead of dropped), or the tiers named in
  ``write_tiers``. An optional admission threshold stores a chunk only once it was requested
  that many times (see :mod:`kvstack.kv.admission`).
- **Reads**: each chunk comes from the fastest tier holding it, and a hit in a slower tier is
  promoted into the faster ones. A lookup returns the contiguous prefix only: the first missing
  chunk ends the hit.
- **Failures**: an exception from any tier is logged once per incident, counted, and treated as
  a miss (reads) or as not stored (writes). Corrupt data is never returned (tiers verify).
- **Trust**: with the cluster's keys (``keys``, or the ``security`` section for
  :meth:`from_config`) every tier seals what it writes and checks what it reads (see
  :mod:`kvstack.kv.seal`); a forged or foreign chunk is a miss. Reads allocate at most one
  chunk of the cache's layout once that is known.
- **Bad input** (wrong KV shape or dtype, non-integer tokens) raises ``ValueError`` naming the
  problem, and nothing is stored.

The chunk-level API is the vLLM connector's: ``chunk_keys`` → ``contains_prefix`` (no side
effects) → ``get_chunks_into`` caller buffers; ``put_chunks`` or ``prepare_put`` /
``complete_put`` (fill tier memory directly); ``count_requests`` once per engine request when
an admission threshold is set. Thread-safe. Typical use::

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
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvstack.errors import ConfigError
from kvstack.kv.admission import AdmissionThreshold
from kvstack.kv.chain import TierChain, leading, tiers_from_config, write_tier_positions
from kvstack.kv.config import KVConfig
from kvstack.kv.format import ITEM_BYTES
from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys, chunk_spans
from kvstack.kv.layout import KVLayout
from kvstack.kv.seal import ChunkSealer
from kvstack.kv.stats import CacheCounters, CacheStats
from kvstack.kv.tensors import torch
from kvstack.kv.tiers import Tier, TierEvent
from kvstack.kv.trust import ChunkTrust
from kvstack.section import load_section, log_config_once

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys, SecurityConfig

__all__ = ["CacheStats", "KVCache"]

log = logging.getLogger(__name__)
MAX_NAMESPACES = 4096  # (salt, adapter) digests kept; recomputing one costs a microsecond


class KVCache:
    def __init__(
        self,
        config: KVConfig,
        tiers: Sequence[Tier] | None = None,
        keys: ClusterKeys | None = None,
    ) -> None:
        """``keys``: the cluster's keys (chunks are sealed and checked with them); given
        ``tiers`` then share the cache's :class:`~kvstack.kv.trust.ChunkTrust`."""
        self.config = config
        self.keys = keys
        shape = config.model_shape
        self._layout = KVLayout(
            config.kv_dtype,
            None if shape is None else (shape.num_layers, shape.num_kv_heads, shape.head_dim),
        )
        self.trust = ChunkTrust(None if keys is None else ChunkSealer(keys))
        self._bound_reads()
        if tiers is not None and not tiers:
            raise ConfigError("a KVCache needs at least one tier")
        write_tiers = (
            write_tier_positions(config, [t.name for t in tiers]) if tiers is not None else None
        )
        if tiers is not None and keys is not None:
            for tier in tiers:
                tier.trust = self.trust
        self.tiers: list[Tier] = (
            list(tiers) if tiers is not None else tiers_from_config(config, self.trust)
        )
        if write_tiers is None:
            write_tiers = write_tier_positions(config, [t.name for t in self.tiers])
        self._chain = TierChain(
            self.tiers, [self.tiers[i] for i in write_tiers], config.promote_on_hit
        )
        self._admission = AdmissionThreshold(config.admission_threshold)
        self._counters = CacheCounters()
        self._namespaces: OrderedDict[tuple[str, str], ChunkKey] = OrderedDict()
        self._ns_lock = threading.Lock()
        self._listeners: list[Callable[[TierEvent], None]] = []
        self._closed = False
        for position, tier in enumerate(self.tiers):
            tier.add_listener(functools.partial(self._on_tier_event, position))

    @classmethod
    def from_config(
        cls,
        config: KVConfig | Mapping[str, Any] | None = None,
        security: SecurityConfig | Mapping[str, Any] | None = None,
    ) -> KVCache:
        """Build from a ``kv`` section: a KVConfig, or a dict merged over the YAML file named by
        ``KVSTACK_CONFIG`` and overridden by ``KVSTACK_KV_*`` environment variables; the keys
        come from the ``security`` section, loaded the same way (``security`` overrides)."""
        from kvstack.security import SecurityConfig, load_keys, load_security

        section = config if isinstance(config, KVConfig) else load_section("kv", KVConfig, config)
        log_config_once("kv", section)
        if isinstance(security, SecurityConfig):
            keys = load_keys(security)
        else:
            keys = load_security(security)[1]
        return cls(section, keys=keys)

    def _bound_reads(self) -> None:
        """Once the layout is known, no read allocates more than one chunk of it."""
        if self._layout.dtype is not None and self._layout.shape is not None:
            layers, heads, head_dim = self._layout.shape
            per_token = 2 * layers * heads * head_dim * ITEM_BYTES[self._layout.dtype]
            self.trust.max_chunk_bytes = per_token * self.config.chunk_size

    # -- keys ------------------------------------------------------------------------------
    def namespace(self, salt: str | None = None, adapter: str | None = None) -> ChunkKey:
        """The 16-byte seed of the key chain for this model, dtype, TP rank, adapter and salt."""
        slot = (salt or "", adapter or "")
        with self._ns_lock:
            digest = self._namespaces.get(slot)
            if digest is not None:
                self._namespaces.move_to_end(slot)
                return digest
        c = self.config
        ns = Namespace(
            c.model, c.kv_dtype or "auto", c.layout_version, c.tp_rank, c.tp_size, slot[1], slot[0]
        )
        digest = ns.digest()
        with self._ns_lock:
            self._namespaces[slot] = digest
            if len(self._namespaces) > MAX_NAMESPACES:
                self._namespaces.popitem(last=False)
        return digest

    def chunk_keys(
        self, tokens: Sequence[int] | Any, salt: str | None = None, adapter: str | None = None
    ) -> list[ChunkKey]:
        """Keys of the chunks of ``tokens`` (ValueError for non-integer tokens)."""
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
        spans = self._spans(len(tokens))
        self._layout.check(kv, len(tokens))
        self._bound_reads()
        stored = self.put_chunks(keys, [kv[:, :, start:end] for start, end in spans])
        num = spans[stored - 1][1] if stored else 0
        self._counters.add(stored_tokens=num)
        return num

    def lookup(
        self, tokens: Sequence[int] | Any, salt: str | None = None, adapter: str | None = None
    ) -> int:
        """Tokens in the longest stored prefix of ``tokens`` (0 on a miss)."""
        keys = self.chunk_keys(tokens, salt, adapter)
        self._admission.record(keys)
        found = self._chain.contains_prefix(keys)
        num = self._spans(len(tokens))[found - 1][1] if found else 0
        self._counters.add(lookups=1, lookup_tokens=len(tokens), hit_tokens=num)
        return num

    def retrieve(
        self, tokens: Sequence[int] | Any, salt: str | None = None, adapter: str | None = None
    ) -> tuple[torch.Tensor | None, int]:
        """KV of the longest stored prefix of ``tokens`` and its length; ``None, 0`` on a miss."""
        keys = self.chunk_keys(tokens, salt, adapter)
        self._admission.record(keys)
        chunks: list[torch.Tensor] = []
        for key, (start, end) in zip(keys, self._spans(len(tokens)), strict=True):
            chunk, position = self._chain.get(key)
            if chunk is None or not self._layout.matches(chunk, end - start, _first(chunks)):
                break
            self._chain.promote(position, key, chunk, owned=True)
            chunks.append(chunk)
        if not chunks:
            return None, 0
        kv = torch.cat(chunks, dim=2) if len(chunks) > 1 else chunks[0].clone()
        self._counters.add(retrieved_tokens=int(kv.shape[2]))
        return kv, int(kv.shape[2])

    # -- the chunk-level API (the connector's) ---------------------------------------------
    def contains_prefix(self, keys: Sequence[ChunkKey]) -> int:
        """How many leading ``keys`` some tier holds (no side effects)."""
        return self._chain.contains_prefix(keys)

    def count_requests(self, keys: Sequence[ChunkKey]) -> None:
        """Count one request for each key (for the admission threshold)."""
        self._admission.record(keys)

    def put_chunks(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor]) -> int:
        """Store chunks (tensors or views; the cache copies what it keeps). Returns how many
        leading chunks are now held (or queued) by at least one tier."""
        if len(keys) != len(chunks):
            raise ValueError(f"{len(keys)} keys but {len(chunks)} chunks")
        admitted = self._admission.admit(keys)
        rejected = admitted.count(False)
        if rejected:
            self._counters.add(admission_rejected=rejected)
        held = [
            ok and self._chain.put(k, c) for k, c, ok in zip(keys, chunks, admitted, strict=True)
        ]
        return leading(held)

    def get_chunks_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> int:
        """Load chunks into caller buffers (each of its chunk's exact shape and dtype).
        Returns how many leading chunks were loaded; later buffers are undefined."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} output buffers")
        return self._chain.get_many_into(keys, outs)

    def prepare_put(
        self, key: ChunkKey, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor | None:
        """A writable buffer in the first write tier's memory for chunk ``key``; fill it, then
        call :meth:`complete_put`. None when the key is not admitted, already stored or being
        stored, the tier has no room or does not support it (then use :meth:`put_chunks`)."""
        if not self._admission.admit([key])[0]:
            self._counters.add(admission_rejected=1)
            return None
        return self._chain.prepare_put(key, dtype, shape)

    def complete_put(self, key: ChunkKey, ok: bool = True) -> bool:
        """Publish (``ok``) or abandon a buffer from :meth:`prepare_put`; True if stored (then
        written through to the other write tiers)."""
        return self._chain.complete_put(key, ok)

    def add_listener(self, listener: Callable[[TierEvent], None]) -> None:
        """Receive every tier's stored/removed events (KV event streams, index announcements).
        Called on the thread that caused the event; keep it quick and non-blocking."""
        self._listeners.append(listener)

    def _on_tier_event(self, position: int, event: TierEvent) -> None:
        if event.kind == "removed" and event.reason == "evicted":
            self._chain.demote(position, event)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a listener is outside code: never let it break a tier call
                log.exception("KV cache event listener failed")

    # -- bookkeeping -----------------------------------------------------------------------
    def stats(self) -> CacheStats:
        return self._counters.snapshot([tier.stats() for tier in self.tiers], self._chain.failures)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for background writes of every tier; False on timeout."""
        return all([tier.flush(timeout_s) for tier in self.tiers])

    def check_integrity(self) -> None:
        """Raise AssertionError if any tier's bookkeeping is inconsistent (flushes first)."""
        names = [tier.name for tier in self.tiers]
        assert len(set(names)) == len(names), f"duplicate tier names {names}"
        self.flush()
        for tier in self.tiers:
            tier.check_integrity()

    def close(self, timeout_s: float | None = None) -> None:
        """Finish background writes and close every tier. Idempotent.

        Without ``timeout_s`` each tier gets up to 30 s. With it, all tiers share that
        deadline, and writes not started by then are dropped, so that closing waits at most for
        writes already under way (each bounded by its tier's own timeout)."""
        if self._closed:
            return
        self._closed = True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for tier in self.tiers:
            try:
                if deadline is None:
                    tier.flush(timeout_s=30)
                elif not tier.flush(max(0.0, deadline - time.monotonic())):
                    dropped = tier.drop_queued()
                    if dropped:
                        log.warning("KV tier %s: %d queued writes dropped at close (out of "
                                    "time)", tier.name, dropped)  # fmt: skip
                tier.close()
            except Exception:  # close every tier even if one fails
                log.exception("closing KV tier %s failed", tier.name)

    def __enter__(self) -> KVCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first(chunks: list[torch.Tensor]) -> torch.Tensor | None:
    return chunks[0] if chunks else None
