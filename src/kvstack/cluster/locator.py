"""IndexLocator: which engines hold each chunk, from the cluster index (``locate`` over HTTP or
ZMQ) — the ``peer://?index=URL`` tier's :class:`~kvstack.kv.tiers.peer.locator.PeerLocator`.

Registered by name in :data:`kvstack.kv.tiers.peer.locator.LOCATORS`; the tier imports it only
when it is built with ``index=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstack.index.client import IndexClient
from kvstack.kv.keys import ChunkKey

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["IndexLocator"]


class IndexLocator:
    def __init__(self, url: str, timeout_s: float, keys: ClusterKeys | None = None) -> None:
        self._client = IndexClient(url, timeout_s, keys)

    def locate(self, keys: Sequence[ChunkKey], exclude: str) -> list[list[str]]:
        reply = self._client.locate(keys, exclude=exclude)
        return [[reply.addresses[i] for i in holders] for holders in reply.holders]

    def close(self) -> None:
        self._client.close()
