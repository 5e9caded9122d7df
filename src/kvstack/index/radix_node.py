"""The radix tree's parts: nodes, owners, namespaces, and each owner's LRU bookkeeping.

A :class:`Node` holds a run of tokens (a whole number of pages) and the owners that hold that
run *and every token before it*: ownership is prefix-closed (an owner of a node owns its
parent), which is what a prefix cache holds and what makes a match one walk down the tree.
Each owner keeps its nodes, its token count and a lazy min-heap of ``(last access, -depth)``
entries: the heap's top is the owner's least recently used node, and among nodes touched at
once the deepest comes first, so eviction always takes a leaf of that owner before its
ancestors. Stale heap entries (the node was touched again, split or dropped) are skipped when
popped and compacted away when they outnumber the live ones.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["HeapEntry", "Node", "Owner", "OwnerPolicy", "OwnerState", "PageKey", "RadixNamespace"]

PageKey = tuple[int, ...]
_seq = itertools.count()


class Owner(NamedTuple):
    """Who holds a prefix: a backend and the tier (``gpu``, ``cpu``, ``disk``, ``routed``)."""

    backend: str
    tier: str = "gpu"


@dataclass(frozen=True, slots=True)
class RadixNamespace:
    """Prompts in different namespaces never share nodes: KV computed for another model, LoRA
    adapter or cache salt is not reusable."""

    model: str
    adapter: str = ""
    salt: str = ""


@dataclass(frozen=True, slots=True)
class OwnerPolicy:
    """How much an owner may hold, in tokens (None: unbounded), and for how long after its
    last access, in seconds (None: forever)."""

    capacity_tokens: int | None = None
    ttl_s: float | None = None

    def __post_init__(self) -> None:
        if self.capacity_tokens is not None and self.capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {self.capacity_tokens}")
        if self.ttl_s is not None and self.ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {self.ttl_s}")


class Node:
    __slots__ = ("alive", "children", "depth", "key", "locks", "owners", "parent")

    def __init__(self, key: list[int], parent: Node | None, depth: int) -> None:
        self.key = key
        self.parent = parent  # kept when deleted: positions below resolve through it
        self.alive = True
        self.depth = depth  # tokens from the root to the end of this node
        self.children: dict[PageKey, Node] = {}
        self.owners: dict[Owner, float] = {}  # owner -> last access time
        self.locks: dict[Owner, int] = {}  # owner -> in-flight requests pinning this node

    def locked(self, owner: Owner | None = None) -> bool:
        if owner is None:
            return bool(self.locks)
        return self.locks.get(owner, 0) > 0

    def __repr__(self) -> str:
        return f"Node(len={len(self.key)}, depth={self.depth}, owners={sorted(self.owners)})"


HeapEntry = tuple[float, int, int, Node]


@dataclass
class OwnerState:
    owner: Owner
    policy: OwnerPolicy
    nodes: set[Node] = field(default_factory=set)
    tokens: int = 0
    heap: list[HeapEntry] = field(default_factory=list)

    def touch(self, node: Node, now: float) -> None:
        heapq.heappush(self.heap, (now, -node.depth, next(_seq), node))
        if len(self.heap) > 4 * len(self.nodes) + 256:
            self.compact()

    def compact(self) -> None:
        """Rebuild the heap from the live nodes (drops every stale entry)."""
        owner = self.owner
        entries = [(n.owners[owner], -n.depth, next(_seq), n) for n in self.nodes]
        heapq.heapify(entries)
        self.heap = entries

    def oldest(self) -> HeapEntry | None:
        """The least recently used live entry (stale tops are discarded), not popped."""
        heap, owner = self.heap, self.owner
        while heap:
            entry = heap[0]
            node = entry[3]
            if node in self.nodes and node.owners.get(owner) == entry[0]:
                return entry
            heapq.heappop(heap)
        return None

    def pop_oldest(self) -> HeapEntry | None:
        entry = self.oldest()
        if entry is not None:
            heapq.heappop(self.heap)
        return entry
