"""The ordered tiers of a :class:`~kvstack.kv.KVCache` and the data movement between them.

- **Failure isolation**: every tier call goes through :meth:`TierChain.safe`; an exception is
  counted, logged once per incident and becomes a miss (reads) or "not stored" (writes).
- **Writes** go to the write tiers (all for write-through, the first for write-back, or a named
  selection). The first copying tier (``put_copies``) copies the chunk once; the other tiers get
  that copy (``borrow``, zero-copy) instead of the caller's tensor, which may change afterwards.
- **Reads** come from the fastest tier holding each chunk; hits that the caller can use (the
  leading run) are promoted into every faster tier.
- **Demotion**: a chunk an in-memory tier evicts (offered in ``TierEvent.chunk``) is put into
  the next tier unless that tier already holds it (copied first when that tier keeps references,
  so the evicting tier gets its memory back at once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvstack.errors import ConfigError
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch
from kvstack.kv.tiers import Tier, TierEvent, make_tier, parse_tier_url
from kvstack.kv.trust import ChunkTrust
from kvstack.log import IncidentLogger
from kvstack.metrics import counter

__all__ = ["TierChain", "leading", "tier_names", "tiers_from_config", "write_tier_positions"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_DEMOTED = counter("kvstack_kv_demoted_total", "Evicted chunks demoted to the next tier", ["tier"])
_PROMOTED = counter("kvstack_kv_promoted_total", "Chunks promoted into a faster tier", ["tier"])
_FAILURES = counter(
    "kvstack_kv_tier_failures_total", "Tier calls that raised (treated as misses)", ["tier", "op"]
)


def leading(flags: Sequence[bool]) -> int:
    """Length of the leading run of True."""
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)


class TierChain:
    def __init__(self, tiers: Sequence[Tier], write_tiers: Sequence[Tier], promote: bool) -> None:
        self.tiers = list(tiers)
        self.write_tiers = list(write_tiers)
        self.promote_on_hit = promote
        self.failures = 0
        self._incidents = IncidentLogger(log)
        self._prepared: dict[ChunkKey, Tier] = {}
        self._lock = threading.Lock()

    def safe(self, tier: Tier, op: str, call: Callable[..., T], *args: Any, default: T) -> T:
        """Run one tier operation; a failure is counted, logged once per incident, and
        becomes ``default``."""
        try:
            return call(*args)
        except Exception as exc:
            with self._lock:
                self.failures += 1
            _FAILURES.labels(tier.name, op).inc()
            self._incidents.warning(
                f"{tier.name}:{op}",
                "KV tier %s failed %s (treated as a miss): %r",
                tier.name,
                op,
                exc,
            )
            return default

    # -- reads -----------------------------------------------------------------------------
    def contains_prefix(self, keys: Sequence[ChunkKey]) -> int:
        found = [False] * len(keys)
        for tier in self.tiers:
            todo = [i for i, hit in enumerate(found) if not hit]
            if not todo:
                break
            asked = [keys[i] for i in todo]
            no: list[bool] = []
            present = self.safe(tier, "contains", tier.contains_many, asked, default=no)
            for i, hit in zip(todo, present, strict=False):
                found[i] = bool(hit)
        return leading(found)

    def get(self, key: ChunkKey) -> tuple[torch.Tensor | None, int]:
        """The chunk from the fastest tier holding it, and that tier's position."""
        for position, tier in enumerate(self.tiers):
            chunk = self.safe(tier, "get", tier.get, key, default=None)
            if chunk is not None:
                return chunk, position
        return None, -1

    def get_many_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> int:
        """Fill ``outs`` from the fastest tiers; the number of leading chunks loaded."""
        source = [-1] * len(keys)
        for position, tier in enumerate(self.tiers):
            todo = [i for i, s in enumerate(source) if s < 0]
            if not todo:
                break
            ks, os_ = [keys[i] for i in todo], [outs[i] for i in todo]
            no: list[bool] = []
            got = self.safe(tier, "get", tier.get_many_into, ks, os_, default=no)
            for i, hit in zip(todo, got, strict=False):
                if hit:
                    source[i] = position
        num = leading([s >= 0 for s in source])
        for i in range(num):
            self.promote(source[i], keys[i], outs[i], owned=False)
        return num

    def promote(self, position: int, key: ChunkKey, chunk: torch.Tensor, owned: bool) -> None:
        """Copy a chunk found at ``position`` into the faster tiers (``owned``: nobody will
        modify ``chunk``, so non-copying tiers may keep it)."""
        if position <= 0 or not self.promote_on_hit:
            return
        for tier in self.tiers[:position]:
            if self._put(tier, key, chunk, owned):
                _PROMOTED.labels(tier.name).inc()

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor, owned: bool = False) -> bool:
        """Store one chunk in the write tiers; True if at least one holds or queued it."""
        held = False
        for tier in self.write_tiers:
            ok = self._put(tier, key, chunk, owned)
            if ok and not owned and tier.put_copies:
                shared = self.safe(tier, "borrow", tier.borrow, key, default=None)
                if shared is not None:  # one immutable copy for the remaining tiers
                    chunk, owned = shared, True
            held = held or ok
        return held

    def _put(self, tier: Tier, key: ChunkKey, chunk: torch.Tensor, owned: bool) -> bool:
        if not owned and not tier.put_copies:
            chunk = _private_copy(chunk)
        return self.safe(tier, "put", tier.put, key, chunk, default=False)

    def prepare_put(
        self, key: ChunkKey, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor | None:
        """A buffer in the first write tier's memory (None: use :meth:`put`)."""
        if not self.write_tiers:
            return None
        tier = self.write_tiers[0]
        buffer = self.safe(tier, "put", tier.prepare_put, key, dtype, shape, default=None)
        if buffer is not None:
            with self._lock:
                self._prepared[key] = tier
        return buffer

    def complete_put(self, key: ChunkKey, ok: bool) -> bool:
        with self._lock:
            tier = self._prepared.pop(key, None)
        if tier is None:
            return False
        if not self.safe(tier, "put", tier.complete_put, key, ok, default=False):
            return False
        shared = self.safe(tier, "borrow", tier.borrow, key, default=None)
        for other in self.write_tiers[1:]:
            if shared is not None:
                self._put(other, key, shared, owned=True)
        return True

    # -- demotion --------------------------------------------------------------------------
    def demote(self, position: int, event: TierEvent) -> None:
        """Put a chunk evicted at ``position`` into the next tier, unless it holds it."""
        if event.chunk is None or position + 1 >= len(self.tiers):
            return
        nxt = self.tiers[position + 1]
        if self.safe(nxt, "contains", nxt.contains, event.key, default=True):
            return
        # Not owned: the evicting tier reuses the memory as soon as this call returns.
        if self._put(nxt, event.key, event.chunk, owned=False):
            _DEMOTED.labels(nxt.name).inc()

    def pending_prepared(self) -> int:
        with self._lock:
            return len(self._prepared)


def _private_copy(chunk: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy nobody else references."""
    if chunk.device.type != "cpu":
        return chunk.to("cpu").contiguous()
    return chunk.clone(memory_format=torch.contiguous_format)


def tiers_from_config(config: KVConfig, trust: ChunkTrust) -> list[Tier]:
    """The tiers of ``config.tiers``, built in order and sharing ``trust`` (all closed again
    if one fails)."""
    names = tier_names(config.tiers)
    write_tier_positions(config, names)  # a bad selection fails before any tier starts
    tiers: list[Tier] = []
    try:
        for url, name in zip(config.tiers, names, strict=True):
            tiers.append(make_tier(url, name=name, trust=trust))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return tiers


def tier_names(urls: Sequence[str]) -> list[str]:
    """The scheme, plus the position when a scheme repeats: cpu, file, cpu2."""
    names: list[str] = []
    for position, url in enumerate(urls):
        scheme = parse_tier_url(url).scheme
        names.append(scheme if scheme not in names else f"{scheme}{position}")
    return names


def write_tier_positions(config: KVConfig, names: list[str]) -> list[int]:
    """Positions of the tiers that receive stores."""
    if config.write_tiers is not None:
        unknown = [n for n in config.write_tiers if n not in names]
        if unknown:
            raise ConfigError(f"kv.write_tiers names unknown tiers {unknown}; tiers: {names}")
        return [names.index(n) for n in config.write_tiers]
    return list(range(len(names))) if config.write_policy == "write-through" else [0]
