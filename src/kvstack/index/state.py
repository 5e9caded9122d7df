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

from kvstack.index import answers
from kvstack.index.protocol import (
    AnnounceBatch,
    EventReply,
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
                self._forget_chunks(instance.id)
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

    def _forget_chunks(self, instance_id: str) -> None:
        """Drop every local location of the engine, also of tiers it no longer lists."""
        for location in [loc for loc in self.index.locations() if loc.holder == instance_id]:
            self.index.drop(location)

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
            self._forget_chunks(instance.id)
        if gone:
            used = {loc for i in self.instances.values() for loc in i.locations(shared=True)}
            for location in list(self.index.locations()):
                if location.holder == SHARED and location not in used:
                    self.index.drop(location)
        return [i.id for i in gone]

    # -- questions -------------------------------------------------------------------------
    def lookup(self, request: LookupRequest) -> LookupReply:
        plan = answers.plan_lookup(self.instances.values(), request, self.max_lookup_tokens)
        runs = [
            self.index.prefix_runs(chain.keys, answers.lookup_groups(chain.members))
            for chain in plan.chains
        ]
        return answers.answer_lookup(plan, runs)

    def locate(self, request: LocateRequest) -> LocateReply:
        """Which engines (other than the asker) hold each key in a local tier and lend it."""
        return answers.answer_locate(
            self.instances.values(),
            request,
            lambda key: (location.holder for location in self.index.holders(key)),
        )

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
