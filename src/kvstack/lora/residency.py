"""Where each adapter version is on one engine, and the capacity plan; no I/O, no clock.

An entry moves ``materialising → warm → loading → hot`` and back down. Warm slots (verified
files on the engine host) count every entry; hot slots (loaded in the engine) count entries
``loading`` or ``hot``. The manager performs the I/O a transition implies; this class only
decides and records, synchronously, so concurrent coroutines see consistent capacity.

Protection: an entry with requests in flight, requests waiting for it, or reported running by
the engine is never a victim. Pinned entries (a ``never_evict_when`` rule matches a current
version) never leave the host; at the GPU tier they are demoted only when every other hot
entry is protected too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

from kvstack.lora.adapters import AdapterVersion
from kvstack.lora.facts import AdapterFacts
from kvstack.lora.policy import AdapterPolicy, EvictionCandidate

__all__ = ["EngineCache", "Entry", "ResidencyTier", "State"]


class ResidencyTier(str, Enum):
    HOT = "hot"
    WARM = "warm"
    COLD = "cold"


class State(str, Enum):
    MATERIALISING = "materialising"  # fetching and verifying into the warm directory
    WARM = "warm"
    LOADING = "loading"  # the engine is loading it
    HOT = "hot"


@dataclass(slots=True)
class Entry:
    adapter: AdapterVersion
    path: str  # as the engine sees it
    state: State = State.MATERIALISING
    in_flight: int = 0
    busy_until: float = 0.0  # the engine reported it running until this time
    changed: int = 0  # the cache's epoch at its last transition

    @property
    def name(self) -> str:
        return self.adapter.engine_name

    @property
    def tier(self) -> ResidencyTier:
        return ResidencyTier.HOT if self.state in (State.HOT, State.LOADING) else ResidencyTier.WARM

    def protected(self, now: float) -> bool:
        return self.in_flight > 0 or self.busy_until > now


FactsFn = Callable[[Entry, float], AdapterFacts]
PinnedFn = Callable[[AdapterFacts], bool]
ReloadFn = Callable[[Entry, ResidencyTier], float]


class EngineCache:
    def __init__(
        self,
        gpu_slots: int,
        host_slots: int,
        policy: AdapterPolicy,
        facts: FactsFn,
        pinned: PinnedFn,
        reload_s: ReloadFn,
    ) -> None:
        if host_slots < gpu_slots:
            raise ValueError(f"host slots ({host_slots}) must be >= GPU slots ({gpu_slots})")
        self.gpu_slots = gpu_slots
        self.host_slots = host_slots
        self.policy = policy
        self._facts = facts
        self._pinned = pinned
        self._reload_s = reload_s
        self.entries: dict[str, Entry] = {}
        self.waiters: dict[str, int] = {}  # requests waiting for a load, by name
        # Transitions are numbered, so that a reconciliation can ignore what changed after it
        # asked the engine (its answer predates those changes).
        self.epoch = 0
        self._dropped: dict[str, int] = {}  # name -> epoch it left the host tier

    # -- queries --------------------------------------------------------------------------

    def residency(self, name: str) -> ResidencyTier:
        entry = self.entries.get(name)
        if entry is None or entry.state is State.MATERIALISING:
            return ResidencyTier.COLD
        return ResidencyTier.HOT if entry.state is State.HOT else ResidencyTier.WARM

    def num_hot(self) -> int:
        return sum(1 for e in self.entries.values() if e.tier is ResidencyTier.HOT)

    def free_hot_slots(self) -> int:
        return self.gpu_slots - self.num_hot()

    def free_warm_slots(self) -> int:
        return self.host_slots - len(self.entries)

    def names(self, state: State) -> list[str]:
        return sorted(n for n, e in self.entries.items() if e.state is state)

    def is_protected(self, entry: Entry, now: float) -> bool:
        """In use, awaited or reported running: never a victim."""
        return entry.protected(now) or self.waiters.get(entry.name, 0) > 0

    def add_waiter(self, name: str, delta: int) -> None:
        count = self.waiters.get(name, 0) + delta
        if count > 0:
            self.waiters[name] = count
        else:
            self.waiters.pop(name, None)

    def changed_since(self, name: str, epoch: int) -> bool:
        """Whether ``name`` moved (or left) after ``epoch`` (read before asking the engine)."""
        entry = self.entries.get(name)
        if entry is not None and entry.changed > epoch:
            return True
        return self._dropped.get(name, -1) > epoch

    def forget_changes(self, epoch: int) -> None:
        """Drop the record of removals up to ``epoch`` (no question older than it is pending)."""
        self._dropped = {n: e for n, e in self._dropped.items() if e > epoch}

    def _moved(self, entry: Entry, state: State) -> None:
        self.epoch += 1
        entry.state, entry.changed = state, self.epoch

    def _removed(self, name: str) -> Entry | None:
        self.epoch += 1
        self._dropped[name] = self.epoch
        return self.entries.pop(name, None)

    def is_pinned(self, entry: Entry, now: float) -> bool:
        return self._pinned(self._facts(entry, now))

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self.entries.values()))

    # -- transitions ----------------------------------------------------------------------

    def begin_materialise(
        self, adapter: AdapterVersion, path: str, now: float
    ) -> list[Entry] | None:
        """Reserve a warm slot; returns the entries dropped to make room (their files must be
        deleted), or None when every warm entry is protected or pinned (nothing changes)."""
        assert adapter.engine_name not in self.entries, "single-flight violated"
        victims = self._choose(State.WARM, 1 - self.free_warm_slots(), now, allow_pinned=False)
        if victims is None:
            return None
        for victim in victims:
            self._removed(victim.name)
        entry = self.entries[adapter.engine_name] = Entry(adapter, path)
        self._moved(entry, State.MATERIALISING)
        return victims

    def begin_hot(self, name: str, now: float) -> list[Entry] | None:
        """Reserve a hot slot for a warm entry; returns the hot entries demoted to warm (they
        must be unloaded), or None when every hot entry is protected."""
        entry = self.entries[name]
        assert entry.state is State.WARM, f"{name} is {entry.state.value}, not warm"
        victims = self._choose(State.HOT, 1 - self.free_hot_slots(), now, allow_pinned=True)
        if victims is None:
            return None
        for victim in victims:
            self._moved(victim, State.WARM)
        self._moved(entry, State.LOADING)
        return victims

    def set_state(self, name: str, state: State) -> None:
        self._moved(self.entries[name], state)

    def drop(self, name: str) -> Entry | None:
        return self._removed(name) if name in self.entries else None

    def adopt(self, adapter: AdapterVersion, path: str, state: State) -> Entry:
        """Record an entry found on the engine or the host (reconciliation), over capacity if
        need be; later loads evict back down to capacity."""
        entry = self.entries.get(adapter.engine_name) or Entry(adapter, path)
        self._moved(entry, state)
        self.entries[adapter.engine_name] = entry
        return entry

    # -- victims --------------------------------------------------------------------------

    def _choose(
        self, state: State, count: int, now: float, allow_pinned: bool
    ) -> list[Entry] | None:
        victims: list[Entry] = []
        for _ in range(max(0, count)):
            victim = self._victim(state, now, allow_pinned, exclude=victims)
            if victim is None:
                return None
            victims.append(victim)
        return victims

    def _victim(
        self, state: State, now: float, allow_pinned: bool, exclude: list[Entry]
    ) -> Entry | None:
        free: list[EvictionCandidate] = []
        pinned: list[EvictionCandidate] = []
        from_tier = ResidencyTier.HOT if state is State.HOT else ResidencyTier.WARM
        for entry in self.entries.values():
            if entry.state is not state or entry in exclude or self.is_protected(entry, now):
                continue
            facts = self._facts(entry, now)
            reload_s = self._reload_s(entry, from_tier)
            candidate = EvictionCandidate(entry.name, facts, _last_request_at(facts, now), reload_s)
            (pinned if self._pinned(facts) else free).append(candidate)
        chosen = self.policy.victim(free) or (self.policy.victim(pinned) if allow_pinned else None)
        return None if chosen is None else self.entries[chosen.name]


def _last_request_at(facts: AdapterFacts, now: float) -> float:
    idle_min = facts.no_request_for_minutes
    return 0.0 if math.isinf(idle_min) else now - idle_min * 60.0
