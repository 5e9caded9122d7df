"""Tiers by URL scheme. A new tier is one module plus one ``TIERS.register`` line here.

``make_tier("cpu://?size=8GiB")``, ``make_tier("file:///var/kv?size=100GiB")``; remote tiers
(``redis://``, ``rediss://``, ``s3://``, ``peer://``) import their client libraries only when used.
"""

from __future__ import annotations

from typing import Protocol

from kvstack.kv.tiers.base import Tier, TierEvent, TierStats, TierURL, parse_tier_url
from kvstack.kv.trust import ChunkTrust
from kvstack.registry import Registry

__all__ = ["TIERS", "Tier", "TierEvent", "TierStats", "TierURL", "make_tier", "parse_tier_url"]


class TierFactory(Protocol):
    def from_url(self, url: TierURL, name: str = ..., trust: ChunkTrust | None = ...) -> Tier: ...


TIERS: Registry[TierFactory] = Registry("tier scheme")
TIERS.register("cpu", "kvstack.kv.tiers.cpu.tier:CPUTier")
TIERS.register("file", "kvstack.kv.tiers.file.tier:FileTier")
TIERS.register("redis", "kvstack.kv.tiers.redis.tier:RedisTier")
TIERS.register("rediss", "kvstack.kv.tiers.redis.tier:RedisTier")
TIERS.register("s3", "kvstack.kv.tiers.s3.tier:S3Tier")
TIERS.register("peer", "kvstack.kv.tiers.peer.tier:PeerTier")


def make_tier(url: str, name: str | None = None, trust: ChunkTrust | None = None) -> Tier:
    """Build a tier from its URL; unknown schemes and parameters raise ConfigError. ``trust``
    (the cluster's chunk MAC and read bound) is shared with the caller."""
    parsed = parse_tier_url(url)
    factory = TIERS.get(parsed.scheme)
    return factory.from_url(parsed, name=name or parsed.scheme, trust=trust)
