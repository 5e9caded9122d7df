"""ChunkTrust: what a tier needs to write chunks other members can trust, and to read only
chunks it can trust — the cluster's chunk sealer (None without a secret) and the largest chunk
a read may allocate for.

One object is shared by a :class:`~kvstack.kv.KVCache` and all its tiers; the cache lowers
``max_chunk_bytes`` to its exact chunk size once its KV layout is known (from ``kv.model_shape``
and ``kv.kv_dtype``, or the first store), so a hostile header cannot make a read allocate more
than one chunk of this model. Reads into a caller's buffer are bounded by that buffer already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstack.kv.format import MAX_CHUNK_BYTES
from kvstack.kv.seal import ChunkSealer

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["ChunkTrust"]


@dataclass
class ChunkTrust:
    sealer: ChunkSealer | None = None
    max_chunk_bytes: int = MAX_CHUNK_BYTES

    @property
    def sealed(self) -> bool:
        """Whether chunks are signed on write and checked on read."""
        return self.sealer is not None

    @property
    def keys(self) -> ClusterKeys | None:
        """The cluster's keys (peer handshakes use them too), or None without a secret."""
        return None if self.sealer is None else self.sealer.keys
