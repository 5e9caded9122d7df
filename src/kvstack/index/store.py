"""ChunkIndex: chunk key → the locations holding it, and prefix matching over key chains.

A *location* is one tier of one holder: ``("engine-a", "cpu")``, or a shared store such as
``("shared", "redis://10.0.0.5:6379/0/kvstack:")``. Locations are interned to bit positions,
and each key maps to an int bitmask of the locations holding it: one dict lookup per chunk
answers "who holds this", and the prefix length of every location comes out of a single pass
over a prompt's key chain with a few big-int operations (see :meth:`prefix_runs`).

Dropping a location (an engine left, or re-announces from scratch) is O(1): its bit is retired
and masked out of every answer at once; :meth:`sweep` clears retired bits from the entries a
bounded batch at a time (so a server never stalls on a million-entry scan), after which the bit
is reused. Not thread-safe: the index server runs it on its event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

__all__ = ["ChunkIndex", "Location", "chain_runs"]


class Location(NamedTuple):
    holder: str
    tier: str


class ChunkIndex:
    def __init__(self) -> None:
        self._masks: dict[bytes, int] = {}
        self._ids: dict[Location, int] = {}
        self._locations: dict[int, Location] = {}
        self._counts: dict[int, int] = {}
        self._live = 0  # bits of live locations
        self._retired = 0  # bits still set in some entries, awaiting the sweep
        self._free: list[int] = []
        self._next_bit = 0
        self._sweep_keys: list[bytes] = []

    # -- locations -------------------------------------------------------------------------
    def location_id(self, location: Location) -> int:
        """The bit of ``location``, allocated on first use."""
        bit = self._ids.get(location)
        if bit is None:
            bit = self._free.pop() if self._free else self._take_new_bit()
            self._ids[location] = bit
            self._locations[bit] = location
            self._counts[bit] = 0
            self._live |= 1 << bit
        return bit

    def _take_new_bit(self) -> int:
        bit = self._next_bit
        self._next_bit += 1
        return bit

    def locations(self) -> dict[Location, int]:
        """Every live location and how many chunks it holds."""
        return {loc: self._counts[bit] for loc, bit in self._ids.items()}

    def drop(self, location: Location) -> int:
        """Forget ``location`` and everything it held, at once; returns the chunks it held."""
        bit = self._ids.pop(location, None)
        if bit is None:
            return 0
        del self._locations[bit]
        self._live &= ~(1 << bit)
        self._retired |= 1 << bit
        # Restart the sweep over every entry: entries added since an earlier drop may hold
        # this bit too, and a bit is reused only once no entry holds it.
        self._sweep_keys = list(self._masks)
        return self._counts.pop(bit)

    # -- entries ---------------------------------------------------------------------------
    def add(self, location: Location, keys: Iterable[bytes]) -> int:
        """Record that ``location`` holds ``keys``; returns how many were new to it."""
        bit = self.location_id(location)
        flag, masks, added = 1 << bit, self._masks, 0
        for key in keys:
            old = masks.get(key, 0)
            if not old & flag:
                masks[key] = (old & ~self._retired) | flag
                added += 1
        self._counts[bit] += added
        return added

    def remove(self, location: Location, keys: Iterable[bytes]) -> int:
        """Record that ``location`` no longer holds ``keys``; returns how many it held."""
        bit = self._ids.get(location)
        if bit is None:
            return 0
        flag, masks, removed = 1 << bit, self._masks, 0
        for key in keys:
            old = masks.get(key, 0)
            if old & flag:
                removed += 1
                if old & ~flag & self._live:
                    masks[key] = old & ~flag
                else:
                    del masks[key]
        self._counts[bit] -= removed
        return removed

    def holders(self, key: bytes) -> list[Location]:
        mask = self._masks.get(key, 0) & self._live
        return [self._locations[b] for b in _bits(mask)]

    def __len__(self) -> int:
        """Entries (chunk keys) indexed, including ones only retired locations still hold."""
        return len(self._masks)

    # -- prefix matching -------------------------------------------------------------------
    def prefix_runs(
        self, keys: Sequence[bytes], groups: Mapping[str, Iterable[Location]]
    ) -> dict[str, int]:
        """For each named group of locations, how many leading ``keys`` are each held by at
        least one location of the group (a group of one location: that location's prefix)."""
        live, masks = self._live, self._masks
        chain = []
        for key in keys:
            mask = masks.get(key, 0) & live
            if not mask:
                break
            chain.append(mask)
        return chain_runs(chain, groups, self._ids)

    # -- maintenance -----------------------------------------------------------------------
    def sweep(self, budget: int) -> bool:
        """Clear retired bits from up to ``budget`` entries; True when nothing is left to do."""
        if not self._retired:
            return True
        keys, masks, keep = self._sweep_keys, self._masks, ~self._retired
        for _ in range(min(budget, len(keys))):
            key = keys.pop()
            mask = masks.get(key)
            if mask is not None and mask & self._retired:
                if mask & keep:
                    masks[key] = mask & keep
                else:
                    del masks[key]
        if keys:
            return False
        self._free.extend(_bits(self._retired))
        self._retired = 0
        return True

    def check_integrity(self) -> None:
        """Raise AssertionError if counts, masks or location tables disagree (after a full
        sweep, every entry has a live bit)."""
        assert set(self._ids.values()) == set(self._locations), "id tables disagree"
        assert self._live == sum(1 << b for b in self._locations), "live mask is stale"
        assert not self._live & self._retired, "a bit is both live and retired"
        counts = dict.fromkeys(self._locations, 0)
        for key, mask in self._masks.items():
            assert mask, f"empty entry for {key.hex()}"
            for bit in _bits(mask & self._live):
                counts[bit] += 1
            if not self._retired:
                assert mask & self._live == mask, f"entry {key.hex()} holds dead bits"
        assert counts == self._counts, f"counts {self._counts} != recount {counts}"


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def chain_runs(
    chain: Sequence[int],
    groups: Mapping[str, Iterable[Location]],
    bits: Mapping[Location, int],
) -> dict[str, int]:
    """For each named group of locations, the length of the leading run of ``chain`` (one
    bitmask of holders per key, ``bits`` giving each location's bit) that the group holds."""
    runs = _location_runs(chain)
    return {name: _group_run(chain, runs, locs, bits) for name, locs in groups.items()}


def _group_run(
    chain: Sequence[int],
    runs: dict[int, int],
    locations: Iterable[Location],
    bits: Mapping[Location, int],
) -> int:
    group = 0
    start = 0
    for location in locations:
        bit = bits.get(location)
        if bit is not None:
            group |= 1 << bit
            start = max(start, runs.get(bit, 0))
    if not group:
        return 0
    # A union can run past its longest member where members hold disjoint stretches.
    while start < len(chain) and chain[start] & group:
        start += 1
    return start


def _location_runs(chain: Sequence[int]) -> dict[int, int]:
    """bit → length of the leading run of ``chain`` entries having that bit."""
    runs: dict[int, int] = {}
    if not chain:
        return runs
    active = chain[0]
    for i, mask in enumerate(chain):
        lost = active & ~mask
        if lost:
            for bit in _bits(lost):
                runs[bit] = i
            active &= mask
            if not active:
                return runs
    for bit in _bits(active):
        runs[bit] = len(chain)
    return runs
