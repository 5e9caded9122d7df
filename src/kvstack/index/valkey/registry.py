"""The registry as a reader sees it: engines, their locations' bits, and which are live.

A :class:`RegistrySnapshot` is read atomically (:data:`SNAPSHOT`) and kept until the registry's
version changes; liveness is decided per request from the engines' last report times and the
server's clock (:data:`~kvstack.index.valkey.scripts.STATE`), so an engine that stopped
announcing drops out of answers after the TTL even if no writer has expired it yet.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from kvstack.index.protocol import KeyProfile, TierInfo
from kvstack.index.state import SHARED, Instance
from kvstack.index.store import Location

__all__ = ["SNAPSHOT", "InstanceInfo", "LiveView", "RegistrySnapshot", "live_view", "parse_state"]

# KEYS: layout.REGISTRY_FIELDS
SNAPSHOT = """
local E, V, I, T, L, U, H = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[9]
return {redis.call('GET', V) or '0', redis.call('GET', E) or '', redis.call('HGETALL', I),
        redis.call('HGETALL', T), redis.call('HGETALL', L), redis.call('HGETALL', U),
        redis.call('HGETALL', H)}
"""

_TIERS = msgspec.msgpack.Decoder(list[TierInfo])


class InstanceInfo(msgspec.Struct, frozen=True):
    """What the registry keeps of an engine's report besides its tiers."""

    profile: KeyProfile
    aliases: list[str]
    peer: str


_INFO = msgspec.msgpack.Decoder(InstanceInfo)


def _pairs(flat: Sequence[bytes]) -> dict[str, bytes]:
    return {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}


@dataclass(frozen=True)
class RegistrySnapshot:
    version: bytes
    epoch: str
    instances: dict[str, Instance]  # every registered engine, live or not
    local_bits: dict[str, dict[str, int]]  # engine -> local tier -> bit
    shared_bits: dict[str, int]  # shared store -> bit
    stores: dict[str, list[str]]  # engine -> the shared stores it reads

    @classmethod
    def decode(cls, reply: Sequence[Any]) -> RegistrySnapshot:
        version, epoch, infos, tiers, bits, stores, shared = reply
        tier_lists = {k: _TIERS.decode(v) for k, v in _pairs(tiers).items()}
        instances = {}
        for name, raw in _pairs(infos).items():
            info = _INFO.decode(raw)
            instances[name] = Instance(
                id=name,
                profile=info.profile,
                aliases=frozenset(info.aliases),
                peer=info.peer,
                tiers={t.name: t for t in tier_lists.get(name, [])},
                last_seen=0.0,
            )
        return cls(
            version=bytes(version),
            epoch=bytes(epoch).decode(),
            instances=instances,
            local_bits={k: _bits(v) for k, v in _pairs(bits).items()},
            shared_bits={k: int(v) for k, v in _pairs(shared).items()},
            stores={k: json.loads(v) for k, v in _pairs(stores).items()},
        )


def _bits(raw: bytes) -> dict[str, int]:
    decoded = json.loads(raw)
    return {} if isinstance(decoded, list) else {k: int(v) for k, v in decoded.items()}


class LiveView(NamedTuple):
    """The live engines (ordered by id), each location's bit, the mask of live bits, and the
    engine owning each local bit."""

    instances: list[Instance]
    bits: dict[Location, int]
    live_mask: int
    owners: dict[int, str]


class RegistryState(NamedTuple):
    version: bytes
    now_ms: int
    seen_ms: dict[str, float]


def parse_state(reply: Sequence[Any]) -> RegistryState:
    version, now, flat = reply
    seen = {flat[i].decode(): float(flat[i + 1]) for i in range(0, len(flat), 2)}
    return RegistryState(bytes(version), int(now), seen)


def live_view(snapshot: RegistrySnapshot, state: RegistryState, ttl_s: float) -> LiveView:
    cutoff = state.now_ms - ttl_s * 1000
    live = sorted(
        name for name in snapshot.instances if state.seen_ms.get(name, float("-inf")) >= cutoff
    )
    bits: dict[Location, int] = {}
    owners: dict[int, str] = {}
    for name in live:
        for tier, bit in snapshot.local_bits.get(name, {}).items():
            bits[Location(name, tier)] = bit
            owners[bit] = name
        for store in snapshot.stores.get(name, []):
            if store in snapshot.shared_bits:
                bits[Location(SHARED, store)] = snapshot.shared_bits[store]
    instances = [snapshot.instances[name] for name in live]
    mask = 0
    for bit in bits.values():
        mask |= 1 << bit
    return LiveView(instances, bits, mask, owners)
