"""The KV cache layer: chunk keys, the chunk format, tiers and the tiered :class:`KVCache`.

Pure Python plus torch; no HTTP and no vLLM here. Attributes are imported lazily so that
``kvstack.kv.config`` and ``kvstack.kv.keys`` stay importable without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstack.kv.cache import CacheStats, KVCache
    from kvstack.kv.config import KVConfig
    from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys
    from kvstack.kv.tiers import Tier, TierEvent, make_tier

__all__ = [
    "CacheStats",
    "ChunkKey",
    "KVCache",
    "KVConfig",
    "Namespace",
    "Tier",
    "TierEvent",
    "chunk_keys",
    "make_tier",
]

_LAZY = {
    "CacheStats": "kvstack.kv.cache",
    "KVCache": "kvstack.kv.cache",
    "KVConfig": "kvstack.kv.config",
    "ChunkKey": "kvstack.kv.keys",
    "Namespace": "kvstack.kv.keys",
    "chunk_keys": "kvstack.kv.keys",
    "Tier": "kvstack.kv.tiers",
    "TierEvent": "kvstack.kv.tiers",
    "make_tier": "kvstack.kv.tiers",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvstack.kv' has no attribute {name!r}")
