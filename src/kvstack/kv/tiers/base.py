"""The Tier interface: one storage level of the KV cache, named by a URL.

A tier maps a :data:`~kvstack.kv.keys.ChunkKey` to one chunk: a contiguous torch tensor
(usually ``[num_layers, 2, chunk_tokens, num_kv_heads, head_dim]``). Tiers know nothing of
tokens, prefixes or other tiers; :class:`kvstack.kv.KVCache` composes them.

Contract, for every implementation:

- a miss is a return value (``False`` / ``None``), never an exception; a chunk that fails
  verification is a miss and is removed;
- a tier whose chunks leave this process (disk, stores, peers) seals what it writes and checks
  what it reads with ``self.trust`` (:class:`~kvstack.kv.trust.ChunkTrust`: the cluster's chunk
  MAC and the largest chunk a read may allocate for); see :mod:`kvstack.kv.seal` for why the
  in-process ``cpu://`` tier does not;
- ``put`` may keep a reference to ``chunk`` until it is written (background I/O): callers must
  not modify it afterwards, unless the tier sets ``put_copies = True`` (it copies synchronously);
- ``get_into`` fills a caller-provided tensor of the chunk's exact dtype and shape (it may be a
  strided view, or on another device) and returns ``False`` when the chunk is absent or does not
  match; after ``False`` the contents of ``out`` are undefined;
- ``put`` accepts any tensor (strided, on any device); it returns ``True`` if the chunk is held
  or queued to be written, ``False`` if it was not accepted (full, queue full, closed);
- a tier that writes in the background should serve reads of chunks still queued (as the
  file tier does), and ``remove`` should cancel a queued write: in write-back, an evicted chunk
  travels through the next tier's queue and must stay findable;
- I/O failures of optional remote tiers may raise :class:`~kvstack.errors.TierError` or any
  ``OSError``; the cache counts them and treats them as misses;
- all methods are thread-safe.

Two-phase puts (optional; in-memory tiers implement them): ``prepare_put(key, dtype, shape)``
reserves the chunk's memory inside the tier and returns a writable tensor (or ``None``: use
``put``); the caller fills it and calls ``complete_put(key, ok)``, which publishes the chunk
(``ok=True``) or releases the memory. Until then the key is neither visible nor evictable. This
lets the vLLM connector gather paged KV blocks straight into tier memory, with no staging copy.

Tiers report stored and removed keys to listeners (``add_listener``), on the thread that made
the change: the cache demotes evicted chunks to the next tier and forwards events to vLLM's KV
event stream and the index service. ``TierEvent.chunk`` of an eviction is valid only during the
call.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, NamedTuple
from urllib.parse import parse_qsl, urlsplit

from kvstack.errors import ConfigError
from kvstack.kv.keys import ChunkKey
from kvstack.kv.trust import ChunkTrust

if TYPE_CHECKING:
    import torch

__all__ = ["Tier", "TierEvent", "TierStats", "TierURL", "parse_tier_url"]


class TierEvent(NamedTuple):
    kind: Literal["stored", "removed"]
    tier: str
    key: ChunkKey
    # For evictions, the evicted chunk when the tier can still offer it (for demotion). Valid
    # only during the call: a listener copies what it wants to keep, so that the tier gets the
    # memory back (a tier stops evicting for a put when listeners hold on to evicted chunks).
    chunk: torch.Tensor | None = None
    reason: str = ""  # for removals: "evicted", "corrupt", "removed"


Listener = Callable[[TierEvent], None]


@dataclass
class TierStats:
    name: str
    entries: int = 0
    bytes_used: int = 0
    capacity_bytes: int = 0
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    evictions: int = 0
    corrupt: int = 0
    dropped_writes: int = 0
    errors: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TierURL:
    url: str
    scheme: str
    netloc: str
    path: str
    params: dict[str, str]

    def pop(self, name: str, default: str | None = None) -> str | None:
        return self.params.pop(name, default)

    def reject_unknown(self) -> None:
        """Raise ConfigError if parameters remain that the tier did not consume."""
        if self.params:
            raise ConfigError(
                f"unknown parameter(s) {', '.join(sorted(self.params))} in tier URL {self.url!r}"
            )


def parse_tier_url(url: str) -> TierURL:
    parts = urlsplit(url)
    if not parts.scheme:
        raise ConfigError(f"tier URL {url!r} has no scheme; use e.g. cpu://?size=1GiB")
    params: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in params:
            raise ConfigError(f"parameter {name!r} given twice in tier URL {url!r}")
        params[name] = value
    return TierURL(url, parts.scheme.lower(), parts.netloc, parts.path, params)


class Tier(ABC):
    """One storage level. Subclasses register their URL scheme in ``kvstack.kv.tiers``."""

    scheme: ClassVar[str]
    put_copies: ClassVar[bool] = False
    # True when several processes or machines see the same data (file on shared storage,
    # redis, s3, peers); the router credits such hits to every backend.
    shared: ClassVar[bool] = False

    def __init__(self, name: str, trust: ChunkTrust | None = None) -> None:
        self.name = name
        # How chunks are sealed on write and bounded and checked on read; shared with the cache.
        self.trust = trust or ChunkTrust()
        self._listeners: list[Listener] = []
        self._listeners_lock = threading.Lock()

    # -- single-key operations -------------------------------------------------------------
    @abstractmethod
    def contains(self, key: ChunkKey) -> bool:
        """Whether the chunk is stored (a cheap check; ``get`` may still miss)."""

    @abstractmethod
    def get(self, key: ChunkKey) -> torch.Tensor | None:
        """The chunk as a tensor the caller must not modify, or None on a miss."""

    @abstractmethod
    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        """Copy the chunk into ``out`` (same dtype and shape); False on a miss or mismatch."""

    @abstractmethod
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        """Store the chunk (no-op if present); False if it was not accepted (full, failed)."""

    @abstractmethod
    def remove(self, key: ChunkKey) -> bool:
        """Remove the chunk; False if it was not there."""

    @abstractmethod
    def stats(self) -> TierStats: ...

    def borrow(self, key: ChunkKey) -> torch.Tensor | None:
        """The stored chunk without a copy, for tiers that hold chunks in memory (else None).

        Not counted as a hit. The tier keeps the memory alive while the returned tensor object
        lives; the caller must not modify it. Used to hand one copy to several tiers."""
        return None

    def prepare_put(
        self, key: ChunkKey, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor | None:
        """A writable tensor in tier memory for the chunk, to be filled and then passed to
        :meth:`complete_put`; None if the tier does not support two-phase puts, already holds
        or is preparing the key, or has no room."""
        return None

    def complete_put(self, key: ChunkKey, ok: bool) -> bool:
        """Publish (``ok``) or abandon a chunk from :meth:`prepare_put`; True if now stored."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Finish background work and release resources. Idempotent."""

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until queued background writes are done; False on timeout."""
        return True

    def drop_queued(self) -> int:
        """Forget background writes not started yet (a shutdown out of time); how many."""
        return 0

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raise AssertionError if internal bookkeeping is inconsistent."""

    # -- batched forms; remote tiers override them with pipelined implementations ----------
    def contains_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """``contains`` for each key. An implementation may stop probing after the first absent
        key and report the rest as absent (callers use the leading run; it only shortens a
        hit, never makes one wrong)."""
        return [self.contains(k) for k in keys]

    def get_many_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        return [self.get_into(k, o) for k, o in zip(keys, outs, strict=True)]

    def put_many(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor]) -> list[bool]:
        return [self.put(k, c) for k, c in zip(keys, chunks, strict=True)]

    # -- events ----------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        with self._listeners_lock:
            self._listeners.append(listener)

    def _emit(self, event: TierEvent) -> None:
        for listener in list(self._listeners):
            listener(event)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
