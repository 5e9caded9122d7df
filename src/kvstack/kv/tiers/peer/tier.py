"""``peer://`` — fetch chunks from other engines' CPU and disk tiers.

``peer://?index=http://index:8300&self=engine-a`` asks the cluster index which engines hold
each chunk (``POST /locate``, excluding ``self``; through the :mod:`.locator` seam, answered by
:mod:`kvstack.cluster.locator`); ``peer://10.0.0.7:8400,10.0.0.8:8400`` asks
a static list of peer servers instead. Answers are remembered for ``locate_ttl_s``, so the
cache's ``contains`` and the following ``get`` cost one round trip to the index, not two.

Reads go to the first healthy holder of each chunk, batched per peer, received straight into
the caller's tensors and verified (:mod:`kvstack.kv.tiers.peer.client`); chunks a holder no longer
has are tried at the next holder. Every peer, and the index, sits behind its own circuit
breaker: a dead or slow engine is skipped at once and retried later, and a BUSY peer (its
back-pressure) is a miss. This tier holds nothing itself: ``put`` and ``remove`` decline.

Parameters: ``index``, ``self``, ``timeout_s`` (2), ``connect_timeout_s`` (0.5),
``locate_ttl_s`` (1), ``breaker_failures`` (3), ``breaker_reset_s`` (5).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kvstack.errors import ConfigError, TierError
from kvstack.kv.affinity import enter_background
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.base import Tier, TierStats, TierURL
from kvstack.kv.tiers.metrics import TierMetrics
from kvstack.kv.tiers.peer.client import PeerClient, parse_address
from kvstack.kv.tiers.peer.locator import PeerLocator, default_instance_id, make_locator
from kvstack.kv.tiers.peer.protocol import PeerHeaderError
from kvstack.kv.tiers.remote.breaker import CircuitBreaker
from kvstack.kv.tiers.remote.codec import ReadResult
from kvstack.kv.tiers.remote.options import pop_float, pop_int
from kvstack.kv.trust import ChunkTrust
from kvstack.log import IncidentLogger

__all__ = ["PeerTier"]

log = logging.getLogger(__name__)
LOCATIONS_KEPT = 1 << 16
FAILURES = (OSError, TierError)


class PeerTier(Tier):
    scheme = "peer"
    shared = True

    def __init__(
        self,
        *,
        index_url: str = "",
        peers: Sequence[str] = (),
        self_id: str = "",
        timeout_s: float = 2.0,
        connect_timeout_s: float = 0.5,
        locate_ttl_s: float = 1.0,
        breaker_failures: int = 3,
        breaker_reset_s: float = 5.0,
        name: str = "peer",
        trust: ChunkTrust | None = None,
    ) -> None:
        super().__init__(name, trust)
        if not index_url and not peers:
            raise ConfigError("peer tier needs index=URL or a list of peers (peer://h:p,h:p)")
        for address in peers:
            parse_address(address)
        self.peers = list(peers)
        self.self_id = self_id
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.locate_ttl_s = locate_ttl_s
        self._breaker_args = (breaker_failures, breaker_reset_s)
        self._locator = (
            make_locator("index", index_url, timeout_s, self.trust.keys) if index_url else None
        )
        self._index_breaker = CircuitBreaker(f"{name}-index", *self._breaker_args)
        self._clients: dict[str, tuple[PeerClient, CircuitBreaker]] = {}
        self._located: OrderedDict[ChunkKey, tuple[float, list[str]]] = OrderedDict()
        self._lock = threading.Lock()
        self._metrics = TierMetrics(name)
        self._incidents = IncidentLogger(log)
        self._verify = ThreadPoolExecutor(2, f"kvstack-{name}-verify", enter_background)

    @classmethod
    def from_url(
        cls, url: TierURL, name: str = "peer", trust: ChunkTrust | None = None
    ) -> PeerTier:
        tier = cls(
            index_url=url.pop("index") or "",
            peers=[p for p in url.netloc.split(",") if p],
            self_id=url.pop("self") or default_instance_id(),
            timeout_s=pop_float(url, "timeout_s", 2.0, 0.001),
            connect_timeout_s=pop_float(url, "connect_timeout_s", 0.5, 0.001),
            locate_ttl_s=pop_float(url, "locate_ttl_s", 1.0, 0.0),
            breaker_failures=pop_int(url, "breaker_failures", 3, 1),
            breaker_reset_s=pop_float(url, "breaker_reset_s", 5.0, 0.001),
            name=name,
            trust=trust,
        )
        url.reject_unknown()
        return tier

    # -- where chunks are ------------------------------------------------------------------
    def _peer(self, address: str) -> tuple[PeerClient, CircuitBreaker]:
        with self._lock:
            entry = self._clients.get(address)
            if entry is None:
                client = PeerClient(
                    address, self.connect_timeout_s, self.timeout_s, trust=self.trust
                )
                breaker = CircuitBreaker(f"{self.name}:{address}", *self._breaker_args)
                entry = self._clients[address] = (client, breaker)
            return entry

    def _locate(self, keys: Sequence[ChunkKey]) -> list[list[str]]:
        """Per key, the peer servers that hold it (cached answers younger than the TTL)."""
        now = time.monotonic()
        with self._lock:
            cached = {k: v[1] for k in keys if (v := self._located.get(k)) and v[0] > now}
        fresh = [k for k in dict.fromkeys(keys) if k not in cached]
        locator = self._locator
        found = self._ask_peers(fresh) if locator is None else self._ask_index(locator, fresh)
        with self._lock:
            for key, holders in found.items():
                self._located[key] = (now + self.locate_ttl_s, holders)
                self._located.move_to_end(key)
            while len(self._located) > LOCATIONS_KEPT:
                self._located.popitem(last=False)
        found.update(cached)
        return [found.get(k, []) for k in keys]

    def _ask_index(self, locator: PeerLocator, keys: list[ChunkKey]) -> dict[ChunkKey, list[str]]:
        if not keys or not self._index_breaker.allow():
            return {}
        try:
            holders = locator.locate(keys, exclude=self.self_id)
        except Exception as exc:  # httpx errors, HTTP status, a dead index: all a miss
            self._index_breaker.failure(exc)
            self._metrics.error("locate")
            return {}
        self._index_breaker.success()
        return dict(zip(keys, holders, strict=True))

    def _ask_peers(self, keys: list[ChunkKey]) -> dict[ChunkKey, list[str]]:
        found: dict[ChunkKey, list[str]] = {k: [] for k in keys}
        for address in self.peers if keys else []:
            held = self._call(address, "lookup", keys)
            for key, hit in zip(keys, held or [], strict=False):
                if hit:
                    found[key].append(address)
        return found

    def _call(self, address: str, op: str, *args: Any) -> Any:
        """``client.<op>(*args)`` on one peer behind its breaker; None on failure or refusal."""
        client, breaker = self._peer(address)
        if not breaker.allow():
            return None
        try:
            result = getattr(client, op)(*args)
        except FAILURES as exc:
            breaker.failure(exc)
            self._metrics.error(op)
            if isinstance(exc, PeerHeaderError):
                self._metrics.corrupt(exc.reason)
            self._incidents.warning(
                f"{address}:{op}", "peer tier %s: %s to %s failed: %s", self.name, op, address, exc
            )
            self._forget_holder(address)
            return None
        breaker.success()
        return result

    def _forget_holder(self, address: str) -> None:
        with self._lock:
            for key, (expires, holders) in list(self._located.items()):
                if address in holders:
                    self._located[key] = (expires, [h for h in holders if h != address])

    # -- reads -----------------------------------------------------------------------------
    def contains(self, key: ChunkKey) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        return [any(self._healthy(a) for a in holders) for holders in self._locate(keys)]

    def _healthy(self, address: str) -> bool:
        return self._peer(address)[1].state != "open"

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        return self._read([key], [None])[0]

    def get_into(self, key: ChunkKey, out: torch.Tensor) -> bool:
        return self._read([key], [out])[0] is not None

    def get_many_into(self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        return [chunk is not None for chunk in self._read(keys, outs)]

    def _read(
        self, keys: Sequence[ChunkKey], outs: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        start = time.perf_counter()
        holders = [[a for a in h if self._healthy(a)] for h in self._locate(keys)]
        chunks: list[torch.Tensor | None] = [None] * len(keys)
        todo = [i for i, h in enumerate(holders) if h]
        while todo:  # each round asks every key's next holder; a key leaves on a hit
            by_peer: dict[str, list[int]] = {}
            for i in todo:
                by_peer.setdefault(holders[i].pop(0), []).append(i)
            for address, idx in by_peer.items():
                picked_keys, picked_outs = [keys[i] for i in idx], [outs[i] for i in idx]
                results = self._call(address, "get", picked_keys, picked_outs, self._verify)
                for i, result in zip(idx, results or [], strict=False):
                    chunks[i] = self._account(address, keys[i], result)
            todo = [i for i in todo if chunks[i] is None and holders[i]]
        for chunk in chunks:
            if chunk is None:
                self._metrics.miss()
        if any(c is not None for c in chunks):
            self._metrics.get_seconds.observe(time.perf_counter() - start)
        return chunks

    def _account(self, address: str, key: ChunkKey, result: ReadResult) -> torch.Tensor | None:
        if result.outcome == "hit" and result.chunk is not None:
            self._metrics.hit(result.chunk.numel() * result.chunk.element_size())
            return result.chunk
        if result.outcome == "corrupt":
            self._metrics.corrupt(result.reason)
            self._incidents.warning(
                result.reason, "peer tier %s: chunk %s from %s failed verification (%s): %s",
                self.name, key.hex(), address, result.reason, result.detail,
            )  # fmt: skip
        with self._lock:  # the holder no longer has it (or sent it damaged): ask again later
            self._located.pop(key, None)
        return None

    # -- this tier holds nothing -----------------------------------------------------------
    def put(self, key: ChunkKey, chunk: torch.Tensor) -> bool:
        return False

    def remove(self, key: ChunkKey) -> bool:
        return False

    def stats(self) -> TierStats:
        stats = self._metrics.snapshot(0, 0, 0)
        with self._lock:
            breakers = [b for _, b in self._clients.values()]
        stats.extra["peers_known"] = float(len(breakers))
        stats.extra["peers_open"] = float(sum(b.state == "open" for b in breakers))
        stats.extra["index_open"] = float(self._index_breaker.state == "open")
        return stats

    def close(self) -> None:
        with self._lock:
            clients = [c for c, _ in self._clients.values()]
        for client in clients:
            client.close()
        self._verify.shutdown(wait=True)
        if self._locator is not None:
            self._locator.close()
