"""The index server's state: engines, their tiers, and the chunk index — without HTTP.

Engines register with a *reset* report (the start of a full sync), then send deltas. A report
from an engine the index does not know, or carrying another epoch, is answered ``resync``
(the index restarted or expired the engine): the engine then re-announces everything. An engine
silent for longer than the TTL is forgotten with its chunks; a shared store (redis, s3) is
forgotten when no live engine reports it any more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstack.index import keying
from kvstack.index.protocol import (
    AnnounceBatch,
    EventReply,
    InstanceMatch,
    KeyProfile,
    LocateReply,
    LocateRequest,
    LookupReply,
    LookupRequest,
    TierInfo,
)
from kvstack.index.store import ChunkIndex, Location

__all__ = ["IndexState", "Instance"]

SHARED = "shared"


@dataclass
class Instance:
    id: str
    profile: KeyProfile
    aliases: frozenset[str]
    peer: str
    tiers: dict[str, TierInfo]
    last_seen: float

    def location(self, tier: str) -> Location:
        info = self.tiers.get(tier)
        if info is not None and info.shared:
            return Location(SHARED, info.location or tier)
        return Location(self.id, tier)

    def locations(self, shared: bool | None = None) -> list[Location]:
        """Locations of the engine's tiers (only shared or only local ones if asked)."""
        infos = self.tiers.values()
        return [self.location(t.name) for t in infos if shared is None or t.shared == shared]

    def serves(self, model: str) -> bool:
        return model == self.profile.model or model in self.aliases


class IndexState:
    def __init__(
        self, max_lookup_tokens: int = 1 << 21, clock: Callable[[], float] = time.monotonic
    ):
        self.epoch = uuid.uuid4().hex
        self.index = ChunkIndex()
        self.instances: dict[str, Instance] = {}
        self.max_lookup_tokens = max_lookup_tokens
        self._clock = clock

    # -- reports ---------------------------------------------------------------------------
    def apply(self, batch: AnnounceBatch) -> EventReply:
        instance = self.instances.get(batch.instance)
        if batch.reset:
            if instance is not None:
                for location in instance.locations(shared=False):
                    self.index.drop(location)
            instance = self._register(batch)
        elif instance is None or batch.epoch != self.epoch:
            return EventReply(self.epoch, resync=True)
        else:
            self._refresh(instance, batch)
        for tier, keys in batch.stored.items():
            self.index.add(instance.location(tier), keys)
        for tier, keys in batch.removed.items():
            self.index.remove(instance.location(tier), keys)
        return EventReply(self.epoch)

    def _register(self, batch: AnnounceBatch) -> Instance:
        instance = Instance(
            id=batch.instance,
            profile=batch.profile,
            aliases=frozenset(batch.aliases),
            peer=batch.peer,
            tiers={t.name: t for t in batch.tiers},
            last_seen=self._clock(),
        )
        self.instances[batch.instance] = instance
        return instance

    def _refresh(self, instance: Instance, batch: AnnounceBatch) -> None:
        instance.last_seen = self._clock()
        instance.peer = batch.peer
        instance.profile = batch.profile
        instance.aliases = frozenset(batch.aliases)
        instance.tiers = {t.name: t for t in batch.tiers} or instance.tiers

    def expire(self, ttl_s: float) -> list[str]:
        """Forget engines silent for more than ``ttl_s`` (and stores nobody reports)."""
        cutoff = self._clock() - ttl_s
        gone = [i for i in self.instances.values() if i.last_seen < cutoff]
        for instance in gone:
            del self.instances[instance.id]
            for location in instance.locations(shared=False):
                self.index.drop(location)
        if gone:
            used = {loc for i in self.instances.values() for loc in i.locations(shared=True)}
            for location in list(self.index.locations()):
                if location.holder == SHARED and location not in used:
                    self.index.drop(location)
        return [i.id for i in gone]

    # -- questions -------------------------------------------------------------------------
    def lookup(self, request: LookupRequest) -> LookupReply:
        tokens = keying.request_tokens(request, self.max_lookup_tokens)
        num_tokens = None if tokens is None else len(tokens)
        candidates = [
            i
            for i in self.instances.values()
            if not request.model or request.namespace or i.serves(request.model)
        ]
        by_profile: dict[KeyProfile, list[Instance]] = {}
        for instance in candidates:
            profile = keying.effective_profile(instance.profile, request)
            by_profile.setdefault(profile, []).append(instance)
        reply = LookupReply(num_tokens=num_tokens or 0, instances={}, shared={})
        for profile, members in by_profile.items():
            self._match(profile, members, request, tokens, reply)
        return reply

    def _match(
        self,
        profile: KeyProfile,
        members: list[Instance],
        request: LookupRequest,
        tokens: Any,
        reply: LookupReply,
    ) -> None:
        keys = keying.lookup_keys(profile, request, tokens)
        groups: dict[str, list[Location]] = {}
        for instance in members:
            groups[instance.id] = instance.locations()
            for tier in instance.tiers:
                groups[f"{instance.id}\0{tier}"] = [instance.location(tier)]
            for location in instance.locations(shared=True):
                groups[f"\0{location.tier}"] = [location]
        runs = self.index.prefix_runs(keys, groups)
        num_tokens = None if tokens is None else len(tokens)

        def matched(chunks: int) -> int:
            return keying.tokens_matched(chunks, profile.chunk_size, num_tokens)

        for instance in members:
            reply.instances[instance.id] = InstanceMatch(
                matched_tokens=matched(runs[instance.id]),
                matched_chunks=runs[instance.id],
                chunk_size=profile.chunk_size,
                tiers={t: matched(runs[f"{instance.id}\0{t}"]) for t in instance.tiers},
                peer=instance.peer,
            )
        for name, run in runs.items():
            if name.startswith("\0"):
                reply.shared[name[1:]] = max(reply.shared.get(name[1:], 0), matched(run))

    def locate(self, request: LocateRequest) -> LocateReply:
        """Which engines (other than the asker) hold each key in a local tier and lend it."""
        lenders = {
            i.id: n
            for n, i in enumerate(
                i for i in self.instances.values() if i.peer and i.id != request.exclude
            )
        }
        reply = LocateReply(peers=list(lenders), addresses=[], holders=[])
        reply.addresses = [self.instances[i].peer for i in reply.peers]
        for key in request.keys:
            holders = {lenders[h.holder] for h in self.index.holders(key) if h.holder in lenders}
            reply.holders.append(sorted(holders))
        return reply

    def summary(self) -> list[dict[str, Any]]:
        counts = self.index.locations()
        now = self._clock()
        return [
            {
                "id": i.id,
                "model": i.profile.model,
                "aliases": sorted(i.aliases),
                "peer": i.peer,
                "last_seen_s": round(now - i.last_seen, 3),
                "tiers": {t: counts.get(i.location(t), 0) for t in i.tiers},
            }
            for i in self.instances.values()
        ]
