"""Where the index lives in Valkey: key names, hash tags, and the bitmaps of chunk holders.

Every *location* (one tier of one engine, or one shared store) gets a small integer, its *bit*.
A chunk's entry is a bitmap (a Valkey string, ``SETBIT``) of the locations holding it, so one
``MGET`` answers "who holds each chunk of this prompt", decoded here into Python ints in which
location ``b`` is ``1 << b`` (the in-memory index's masks, :mod:`kvstack.index.store`).

Keys (``P`` is the URL's prefix; ``{...}`` is a Redis Cluster hash tag)::

    {Pr}E  {Pr}V  {Pr}I ...         the registry: one slot, updated by scripts atomically
    {Pb<n>}c<chunk key>             chunk bitmap, in bucket n = first 4 key bytes mod buckets
    {Pb<n>}l<bit>                   the chunks of bucket n a location holds (for cleanup)

Why buckets and not one slot per prompt: a stored chunk is announced by its key alone, which
says nothing of the prompt it starts or continues, so the announcer cannot tag it by prompt.
Spreading entries over ``buckets`` hash tags keeps a lookup at one ``MGET`` per bucket (one
round trip per node, in parallel) while a cluster still shards the index over its masters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["REGISTRY_FIELDS", "KeyLayout", "decode_mask"]

# The registry's keys, in the order the scripts take them (KEYS[1..]).
REGISTRY_FIELDS = ("E", "V", "I", "T", "L", "U", "Q", "S", "H", "O", "N", "F", "X", "G")
# E epoch · V registry version · I engine info · T engine tiers · L engine tier -> bit (JSON)
# U engine shared stores (JSON) · Q report sequence · S last report (zset, server ms)
# H shared store -> bit · O bit -> owner · N next bit · F free bits · X retired bits (zset)
# G maintenance lock
_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


_DECODED: dict[bytes, int] = {}
_DECODED_MAX = 1 << 14


def decode_mask(raw: bytes | None) -> int:
    """A ``SETBIT`` bitmap (bit 0 is the first byte's high bit) as an int with bit b = 1 << b.

    A fleet's entries take few distinct values (who holds a chunk repeats along a prompt and
    across prompts), so decoded values are remembered: a dict lookup instead of a translate
    and a conversion, a fifth of a 512-chunk lookup's decoding time."""
    if not raw:
        return 0
    mask = _DECODED.get(raw)
    if mask is None:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        mask = _DECODED[raw] = int.from_bytes(raw.translate(_REVERSED), "little")
    return mask


# A bucket's MGET in a cluster: redis-py checks that every key of a multi-key command maps to
# one slot (a CRC per key: 40% of a 128K-token lookup's client CPU); a script declaring one key
# of the bucket and taking the rest as arguments is routed by that key alone.
CLUSTER_MGET = "return redis.call('MGET', KEYS[1], unpack(ARGV))"


class KeyLayout:
    def __init__(self, prefix: str, buckets: int, cluster: bool = False) -> None:
        self.buckets = buckets
        self.cluster = cluster
        self._registry_tag = f"{{{prefix}r}}".encode()
        self._tags = [f"{{{prefix}b{n}}}".encode() for n in range(buckets)]
        self.registry = [self._registry_tag + name.encode() for name in REGISTRY_FIELDS]

    def registry_key(self, name: str) -> bytes:
        return self.registry[REGISTRY_FIELDS.index(name)]

    def bucket(self, key: bytes) -> int:
        return int.from_bytes(key[:4], "little") % self.buckets

    def chunk_prefix(self, bucket: int) -> bytes:
        """What a chunk key's entry name is in ``bucket``, before the key itself."""
        return self._tags[bucket] + b"c"

    def chunk(self, key: bytes) -> bytes:
        return self.chunk_prefix(self.bucket(key)) + key

    def holdings(self, bucket: int, bit: int) -> bytes:
        """The set of chunk keys of ``bucket`` that location ``bit`` holds."""
        return self._tags[bucket] + b"l" + str(bit).encode()

    def by_bucket(self, keys: Iterable[bytes]) -> dict[int, list[bytes]]:
        """``keys`` grouped by bucket, each group in the order given."""
        if self.buckets == 1:
            return {0: list(keys)}
        groups: dict[int, list[bytes]] = {}
        buckets = self.buckets
        for key in keys:
            groups.setdefault(int.from_bytes(key[:4], "little") % buckets, []).append(key)
        return groups

    def mget_commands(self, keys: Sequence[bytes]) -> tuple[list[tuple[Any, ...]], list[int]]:
        """One ``MGET`` per bucket for ``keys``, and where each key's answer lands in the
        concatenation of their replies (none for no keys: an ``MGET`` needs one)."""
        if not keys:
            return [], []
        groups = self.by_bucket(keys)
        commands: list[tuple[Any, ...]] = []
        order: list[bytes] = []
        for bucket, members in groups.items():
            prefix = self.chunk_prefix(bucket)
            names = [prefix + k for k in members]
            if self.cluster:
                commands.append(("EVAL", CLUSTER_MGET, 1, *names))
            else:
                commands.append(("MGET", *names))
            order.extend(members)
        if len(groups) <= 1:
            return commands, list(range(len(keys)))
        position = {key: n for n, key in enumerate(order)}
        return commands, [position[k] for k in keys]
