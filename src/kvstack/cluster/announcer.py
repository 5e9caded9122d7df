"""Announcer: reports a :class:`~kvstack.kv.KVCache`'s chunks to the index (the index server
or Valkey: :mod:`kvstack.index.backend`, by ``index_url``).

It listens to the cache's tier events (``cache.add_listener``), keeps a mirror of what each
tier holds, and posts batched deltas every ``interval_s`` (at least every ``heartbeat_s``, so
the index knows the engine is alive). A full sync — a *reset* report followed by the whole
mirror in parts — is sent at start, whenever the index answers ``resync`` (it restarted or
expired this engine), and after an outage longer than ``max_pending_keys`` events. Tiers that
can list their keys (a ``keys()`` method) seed the mirror at start, so chunks stored before
this process started are announced too. Nothing here ever blocks the cache: events are queued
in memory and sent from a thread of its own.

With the cluster's keys (the cache's) every report is authenticated and carries this instance's
announce token (:mod:`kvstack.index.auth`), without which the index refuses it. Reports carry
at most ``max_batch_keys`` keys; a backlog is sent in several.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from kvstack.cluster.config import AnnounceConfig
from kvstack.index.auth import announce_token
from kvstack.index.backend import IndexBackend, open_index
from kvstack.index.protocol import AnnounceBatch, KeyProfile, TierInfo
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.peer.locator import default_instance_id
from kvstack.log import IncidentLogger

if TYPE_CHECKING:
    from kvstack.kv.cache import KVCache
    from kvstack.kv.tiers.base import Tier, TierEvent

__all__ = ["Announcer", "ListsKeys"]

log = logging.getLogger(__name__)
NOT_ANNOUNCED = ("peer",)  # tiers that read other engines' chunks hold nothing themselves


@runtime_checkable
class ListsKeys(Protocol):
    def keys(self) -> Iterator[ChunkKey]: ...


def key_profile(cache: KVCache) -> KeyProfile:
    c = cache.config
    return KeyProfile(
        model=c.model,
        chunk_size=c.chunk_size,
        kv_dtype=c.kv_dtype or "auto",
        layout_version=c.layout_version,
        tp_size=c.tp_size,
        partial=c.save_partial_chunks,
    )


def tier_info(tier: Tier) -> TierInfo:
    return TierInfo(
        tier.name, tier.shared, str(getattr(tier, "location", "")) if tier.shared else ""
    )


class Announcer:
    def __init__(
        self, cache: KVCache, config: AnnounceConfig, client: IndexBackend | None = None
    ) -> None:
        if not config.index_url and client is None:
            raise ValueError("the announcer needs index.announce.index_url")
        self.config = config
        self.instance_id = config.instance_id or default_instance_id()
        keys = cache.keys
        self._token = "" if keys is None else announce_token(keys, self.instance_id)
        self._client = client or open_index(config.index_url, config.timeout_s, keys)
        self._tiers = [t for t in cache.tiers if t.scheme not in NOT_ANNOUNCED]
        self._profile = key_profile(cache)
        self._infos = [tier_info(t) for t in self._tiers]
        self._names = {t.name for t in self._tiers}
        self._mirror: dict[str, set[ChunkKey]] = {t.name: set() for t in self._tiers}
        self._pending: dict[tuple[str, ChunkKey], bool] = {}  # (tier, key) -> stored?
        self._cond = threading.Condition()
        self._report_lock = threading.Lock()
        self._need_sync = True
        self._epoch = ""
        self._stopped = False
        self._incidents = IncidentLogger(log)
        self.reports = 0
        self.full_syncs = 0
        cache.add_listener(self._on_event)
        self._thread = threading.Thread(target=self._run, name="kvstack-announcer", daemon=True)

    def start(self) -> Announcer:
        self._thread.start()
        return self

    # -- events (called from tier threads; never blocks on the network) --------------------
    def _on_event(self, event: TierEvent) -> None:
        if event.tier not in self._names:
            return
        stored = event.kind == "stored"
        with self._cond:
            if stored:
                self._mirror[event.tier].add(event.key)
            else:
                self._mirror[event.tier].discard(event.key)
            self._pending[(event.tier, event.key)] = stored
            if len(self._pending) > self.config.max_pending_keys:
                self._pending.clear()
                self._need_sync = True  # the mirror has it all; resend it whole

    # -- the reporting thread --------------------------------------------------------------
    def _run(self) -> None:
        self._seed_mirror()
        beat = 0.0
        while True:
            with self._cond:
                self._cond.wait(self.config.interval_s)
                if self._stopped:
                    return
                idle = not self._pending and not self._need_sync
            beat += self.config.interval_s
            if idle and beat < self.config.heartbeat_s:
                continue
            beat = 0.0
            self._report()

    def _seed_mirror(self) -> None:
        for tier in self._tiers:
            if not isinstance(tier, ListsKeys):
                continue
            if tier.shared and not self.config.sync_shared_tiers:
                continue
            try:
                listed = set(tier.keys())
            except Exception as exc:  # a listing failure must not stop announcing
                log.warning("announcer: cannot list tier %s for a full sync: %r", tier.name, exc)
                continue
            with self._cond:
                self._mirror[tier.name] |= listed

    def _report(self) -> None:
        try:
            with self._report_lock:  # one report at a time (the thread, or a caller's flush)
                if self._need_sync:
                    self._full_sync()
                else:
                    self._send_pending()
        except Exception as exc:  # network, HTTP status, a dead index: retried next round
            self._incidents.warning(
                "index", "announcer: index %s unreachable (%r); retrying", self._client.url, exc
            )

    def _batch(self, reset: bool = False) -> AnnounceBatch:
        return AnnounceBatch(
            instance=self.instance_id,
            profile=self._profile,
            epoch=self._epoch,
            aliases=list(self.config.served_model_names),
            peer=self.config.peer_address,
            tiers=self._infos,
            reset=reset,
            token=self._token,
        )

    def _send_pending(self) -> None:
        with self._cond:
            pending, self._pending = self._pending, {}
        items = list(pending.items())
        size = self.config.max_batch_keys
        for start in range(0, max(len(items), 1), size):
            batch = self._batch()
            for (tier, key), stored in items[start : start + size]:
                (batch.stored if stored else batch.removed).setdefault(tier, []).append(key)
            try:
                reply = self._client.report(batch)
            except Exception:
                with self._cond:  # keep the unsent ones for the next round; newer events win
                    self._pending = {**dict(items[start:]), **self._pending}
                raise
            self.reports += 1
            self._accept(reply.epoch, reply.resync)
            if reply.resync:
                return  # a full sync follows, with everything

    def _full_sync(self) -> None:
        with self._cond:
            snapshot = {tier: list(keys) for tier, keys in self._mirror.items()}
            self._pending.clear()  # the snapshot covers them
            self._need_sync = False
        try:
            self._send_snapshot(snapshot)
        except BaseException:
            with self._cond:
                self._need_sync = True
            raise
        self.full_syncs += 1
        log.info("announcer: full sync of %d chunks to %s as %s",
                 sum(map(len, snapshot.values())), self._client.url, self.instance_id)  # fmt: skip

    def _send_snapshot(self, snapshot: dict[str, list[ChunkKey]]) -> None:
        parts = list(_parts(snapshot, self.config.max_batch_keys)) or [{}]
        for i, part in enumerate(parts):
            batch = self._batch(reset=i == 0)
            batch.stored = cast("dict[str, list[bytes]]", part)
            reply = self._client.report(batch)
            self.reports += 1
            self._epoch = reply.epoch
            if reply.resync:
                raise ConnectionError("index asked for a resync during a full sync")

    def _accept(self, epoch: str, resync: bool) -> None:
        self._epoch = epoch
        if resync:
            with self._cond:
                self._need_sync = True
            log.info("announcer: index %s asks for a full sync", self._client.url)

    # -- lifecycle -------------------------------------------------------------------------
    def flush(self) -> bool:
        """Report pending events now (for tests and orderly shutdown); False if it failed."""
        self._report()
        with self._cond:
            return not self._pending and not self._need_sync

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._client.close()


def _parts(snapshot: dict[str, list[ChunkKey]], size: int) -> Iterable[dict[str, list[ChunkKey]]]:
    part: dict[str, list[ChunkKey]] = {}
    count = 0
    for tier, keys in snapshot.items():
        for start in range(0, len(keys), size):
            piece = keys[start : start + size]
            if count + len(piece) > size and part:
                yield part
                part, count = {}, 0
            part.setdefault(tier, []).extend(piece)
            count += len(piece)
    if part:
        yield part
