"""LoRA adapters in the simulated engine: registration, host cache and batch slots.

vLLM's model: ``/v1/load_lora_adapter`` registers an adapter and loads it into host memory
(an LRU of ``max_cpu_loras``); a batch may use at most ``max_loras`` distinct adapters, each in
a slot (an LRU of ``max_loras``). Bringing an adapter into a slot costs ``lora_activate_s``, plus
``lora_load_s`` if it fell out of host memory and must be read from storage again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from kvstack.sim.request import Adapter

__all__ = ["LoRASlots"]


class LoRASlots:
    def __init__(
        self, max_loras: int, max_cpu_loras: int, load_s: float, activate_s: float
    ) -> None:
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.load_s = load_s
        self.activate_s = activate_s
        self.registered: dict[str, Adapter] = {}
        self._host: OrderedDict[str, None] = OrderedDict()
        self._slots: OrderedDict[str, None] = OrderedDict()
        self._next_id = 1
        self.num_loads = 0
        self.num_activations = 0

    # -- registration (the HTTP endpoints) ------------------------------------------------
    def next_id(self, name: str) -> int:
        existing = self.registered.get(name)
        if existing is not None:
            return existing.int_id
        self._next_id += 1
        return self._next_id - 1

    def register(self, adapter: Adapter) -> None:
        """Register (or replace in place) an adapter and hold it in host memory."""
        self.registered[adapter.name] = adapter
        self._slots.pop(adapter.name, None)  # new weights: the slot copy is stale
        self._to_host(adapter.name)

    def unregister(self, name: str) -> bool:
        if self.registered.pop(name, None) is None:
            return False
        self._host.pop(name, None)
        self._slots.pop(name, None)
        return True

    def get(self, name: str) -> Adapter | None:
        return self.registered.get(name)

    # -- scheduling ----------------------------------------------------------------------
    def resident(self) -> list[str]:
        return list(self._slots)

    def activate(self, name: str, in_use: Collection[str]) -> float:
        """Make ``name`` resident in a slot, evicting the least recently used slot whose
        adapter no running request uses; returns the simulated cost in seconds. The caller
        guarantees that ``in_use`` leaves a slot (at most ``max_loras - 1`` other adapters)."""
        if name in self._slots:
            self._slots.move_to_end(name)
            return 0.0
        cost = self.activate_s
        if name not in self._host:
            cost += self.load_s
            self._to_host(name)
            self.num_loads += 1
        else:
            self._host.move_to_end(name)
        if len(self._slots) >= self.max_loras:
            victim = next((n for n in self._slots if n not in in_use), None)
            if victim is None:
                raise RuntimeError(f"no free LoRA slot for {name!r}: all in use by {in_use}")
            del self._slots[victim]
        self._slots[name] = None
        self.num_activations += 1
        return cost

    def _to_host(self, name: str) -> None:
        self._host[name] = None
        self._host.move_to_end(name)
        while len(self._host) > self.max_cpu_loras:
            # Prefer adapters outside the slots: a slot's adapter must stay in host memory.
            victim = next((n for n in self._host if n not in self._slots), next(iter(self._host)))
            del self._host[victim]
            self._slots.pop(victim, None)
