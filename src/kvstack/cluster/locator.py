"""IndexLocator: which engines hold each chunk, from the cluster index (``locate`` on the index
server or Valkey, by URL: :mod:`kvstack.index.backend`) — the ``peer://?index=URL`` tier's
:class:`~kvstack.kv.tiers.peer.locator.PeerLocator`.

It remembers the last answer for each chunk (a bounded LRU). While the index cannot be reached
(a Valkey failover, an index server restart), chunks it already located are answered from
that memory, so engines keep fetching from peers they found before: a holder that no longer
has a chunk says so and the read falls back to the next tier, so a stale answer costs a miss,
never a wrong chunk. The index is asked again after ``retry_s``; chunks never located before
are misses meanwhile (the error is raised, which the tier counts).

Registered by name in :data:`kvstack.kv.tiers.peer.locator.LOCATORS`; the tier imports it only
when it is built with ``index=``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvstack.index.backend import open_index
from kvstack.kv.keys import ChunkKey
from kvstack.log import IncidentLogger

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["IndexLocator"]

log = logging.getLogger(__name__)
REMEMBERED_KEYS = 1 << 16


class IndexLocator:
    def __init__(
        self,
        url: str,
        timeout_s: float,
        keys: ClusterKeys | None = None,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = open_index(url, timeout_s, keys)
        self._retry_s = retry_s
        self._clock = clock
        self._known: OrderedDict[ChunkKey, list[str]] = OrderedDict()
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._incidents = IncidentLogger(log)
        self.remembered_answers = 0  # keys answered from memory while the index was down

    def locate(self, keys: Sequence[ChunkKey], exclude: str) -> list[list[str]]:
        if self._clock() < self._down_until:
            return self._remembered(keys, None)
        try:
            reply = self._client.locate(keys, exclude=exclude)
        except Exception as exc:  # any failure of the index: answer what is remembered
            self._down_until = self._clock() + self._retry_s
            return self._remembered(keys, exc)
        found = [[reply.addresses[i] for i in holders] for holders in reply.holders]
        self._remember(keys, found)
        return found

    def _remember(self, keys: Sequence[ChunkKey], found: list[list[str]]) -> None:
        with self._lock:
            for key, holders in zip(keys, found, strict=True):
                self._known[key] = holders
                self._known.move_to_end(key)
            while len(self._known) > REMEMBERED_KEYS:
                self._known.popitem(last=False)

    def _remembered(self, keys: Sequence[ChunkKey], exc: Exception | None) -> list[list[str]]:
        with self._lock:
            answers = [self._known.get(key) for key in keys]
        if all(a is None for a in answers):
            raise exc or ConnectionError(f"index {self._client.url} unreachable; retrying soon")
        self.remembered_answers += sum(a is not None for a in answers)
        self._incidents.warning(
            "index",
            "index %s unreachable (%s); peers located before are used",
            self._client.url,
            exc or "retrying soon",
        )
        return [a or [] for a in answers]

    def close(self) -> None:
        self._client.close()
