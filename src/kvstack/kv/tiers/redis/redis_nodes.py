"""Where a Redis key lives: one standalone server, or the master owning its Redis Cluster slot.

The cluster slot map comes from ``CLUSTER SLOTS`` on any reachable node (seed first) and is
refreshed after a ``MOVED`` reply (at most once per ``refresh_interval_s``); slots are computed
with redis-py's CRC16 (``redis.crc.key_slot``). Connections to each node are pooled
(:class:`~kvstack.kv.tiers.remote.pool.SocketPool`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstack.errors import TierError
from kvstack.kv.tiers.redis.resp import RespConnection, RespError, RespSettings, pack_command
from kvstack.kv.tiers.remote.pool import SocketPool

__all__ = ["NodeAddress", "RedisNodes"]

log = logging.getLogger(__name__)
NUM_SLOTS = 16384


class NodeAddress(NamedTuple):
    host: str
    port: int


class RedisNodes:
    def __init__(
        self,
        seeds: Sequence[NodeAddress],
        settings: RespSettings,
        cluster: bool = False,
        max_idle: int = 8,
        refresh_interval_s: float = 1.0,
    ) -> None:
        if not seeds:
            raise ValueError("redis needs at least one node address")
        self.seeds = list(seeds)
        self.settings = settings
        self.cluster = cluster
        self.max_idle = max_idle
        self.refresh_interval_s = refresh_interval_s
        self._lock = threading.Lock()
        self._pools: dict[NodeAddress, SocketPool[RespConnection]] = {}
        self._slots: list[NodeAddress] | None = None
        self._refreshed_at = float("-inf")

    def pool(self, address: NodeAddress) -> SocketPool[RespConnection]:
        with self._lock:
            pool = self._pools.get(address)
            if pool is None:
                connect = functools.partial(RespConnection, *address, self.settings)
                pool = self._pools[address] = SocketPool(connect, self.max_idle)
            return pool

    def group(self, names: Sequence[bytes]) -> dict[NodeAddress, list[int]]:
        """Indices of ``names`` per node that owns them (connects to learn the slot map)."""
        if not self.cluster:
            return {self.seeds[0]: list(range(len(names)))} if names else {}
        slots = self._slot_map()
        from redis.crc import key_slot

        groups: dict[NodeAddress, list[int]] = {}
        for i, name in enumerate(names):
            groups.setdefault(slots[key_slot(name)], []).append(i)
        return groups

    def masters(self) -> list[NodeAddress]:
        """Every node holding data (for SCAN)."""
        if not self.cluster:
            return self.seeds[:1]
        return sorted(set(self._slot_map()))

    def moved(self) -> None:
        """A MOVED reply was seen: refresh the slot map soon."""
        with self._lock:
            if time.monotonic() - self._refreshed_at >= self.refresh_interval_s:
                self._slots = None

    def _slot_map(self) -> list[NodeAddress]:
        with self._lock:
            slots = self._slots
        if slots is not None:
            return slots
        slots = self._load_slot_map()
        with self._lock:
            self._slots = slots
            self._refreshed_at = time.monotonic()
        return slots

    def _load_slot_map(self) -> list[NodeAddress]:
        errors: list[str] = []
        for seed in self._candidates():
            try:
                conn = RespConnection(seed.host, seed.port, self.settings)
            except OSError as exc:
                errors.append(f"{seed.host}:{seed.port}: {exc}")
                continue
            try:
                (reply,) = conn.pipeline([pack_command("CLUSTER", "SLOTS")])
            finally:
                conn.close()
            return _parse_slots(reply, seed)
        raise TierError(f"no redis cluster node reachable ({'; '.join(errors)})")

    def _candidates(self) -> list[NodeAddress]:
        with self._lock:
            known = list(self._pools)
        return self.seeds + [a for a in known if a not in self.seeds]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def _parse_slots(reply: Any, seed: NodeAddress) -> list[NodeAddress]:
    if isinstance(reply, RespError):
        raise TierError(f"CLUSTER SLOTS failed on {seed.host}:{seed.port}: {reply}")
    if not isinstance(reply, list):
        raise TierError(f"unexpected CLUSTER SLOTS reply from {seed.host}:{seed.port}")
    slots: list[NodeAddress | None] = [None] * NUM_SLOTS
    for entry in reply:
        start, end, master = entry[0], entry[1], entry[2]
        host = master[0].decode() if master[0] else seed.host
        address = NodeAddress(host, int(master[1]))
        slots[start : end + 1] = [address] * (end - start + 1)
    missing = slots.count(None)
    if missing:
        raise TierError(f"redis cluster has {missing} unassigned slots")
    return [s for s in slots if s is not None]
