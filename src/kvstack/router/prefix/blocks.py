"""``BlockTracker``: one backend's KV events mirrored into the router's radix index.

``BlockStored`` carries each block's tokens and its parent's hash, so blocks are placed in the
token tree without re-deriving the engine's hashes (which are seeded per process unless
``PYTHONHASHSEED`` is set): a first block (no parent) starts a path from the namespace's root,
a later one continues from where its parent was placed (a :class:`Position`). The tracker keeps,
per (tier, block hash), that position plus the block's own tokens; should the position be gone,
the path is rebuilt from the parent chain. A block whose parent the router never saw (stored
before it subscribed) cannot be placed and is counted as an orphan.

Media map to tiers: ``GPU`` -> ``gpu``, ``CPU`` -> ``cpu``, ``DISK`` -> ``disk`` (kvstack's
connector reports its tiers this way), anything else lower-cased. ``BlockRemoved`` drops the
block and everything after it on its path from that tier (an engine cannot use a block whose
prefix is gone); ``AllBlocksCleared`` drops the backend's device tier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstack.index.radix import Owner, Position, RadixIndex, RadixNamespace
from kvstack.index.radix_node import Node
from kvstack.router.prefix.events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

__all__ = ["BlockTracker", "EventFormatError", "medium_tier"]

MEDIA = {"GPU": "gpu", "CPU": "cpu", "DISK": "disk"}


class EventFormatError(ValueError):
    """The events do not carry what placing blocks relies on (tokens, a page-aligned size)."""


def medium_tier(medium: str | None) -> str:
    return "gpu" if medium is None else MEDIA.get(medium, medium.lower())


@dataclass(slots=True)
class BlockRef:
    parent: BlockHash | None
    ns: RadixNamespace
    tokens: list[int]
    anchor: Node  # a node at or below the block's end
    end: int  # tokens from the root to the block's end


@dataclass
class TrackerStats:
    stored: int = 0
    removed: int = 0
    orphans: int = 0


class BlockTracker:
    def __init__(
        self, backend_id: str, index: RadixIndex, base_models: Callable[[], list[str]]
    ) -> None:
        self.backend_id = backend_id
        self.index = index
        self._base_models = base_models
        self._blocks: dict[tuple[str, BlockHash], BlockRef] = {}
        self.tiers: set[str] = set()
        self.stats = TrackerStats()

    def apply(self, batch: KVEventBatch) -> None:
        """Apply one batch in order; EventFormatError if the events cannot be placed."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                self._removed(event)
            elif isinstance(event, AllBlocksCleared):
                self.clear(("gpu",))

    def clear(self, tiers: tuple[str, ...] | None = None) -> None:
        """Forget what the events said for ``tiers`` (all by default)."""
        for tier in tiers or tuple(self.tiers):
            self.index.drop_owner(Owner(self.backend_id, tier))
        self._blocks = {k: v for k, v in self._blocks.items() if tiers and k[0] not in tiers}

    def __len__(self) -> int:
        return len(self._blocks)

    # -- stored ----------------------------------------------------------------------------
    def _stored(self, event: BlockStored) -> None:
        self._check(event)
        tier = medium_tier(event.medium)
        owner = Owner(self.backend_id, tier)
        self.tiers.add(tier)
        placed = self._place(event, tier, owner)
        if placed is None:
            self.stats.orphans += len(event.block_hashes)
            return
        ns, anchor, start = placed
        size, parent = event.block_size, event.parent_block_hash
        for i, block_hash in enumerate(event.block_hashes):
            tokens = event.token_ids[i * size : (i + 1) * size]
            self._blocks[(tier, block_hash)] = BlockRef(
                parent, ns, tokens, anchor, start + (i + 1) * size
            )
            parent = block_hash
        self.stats.stored += len(event.block_hashes)

    def _place(
        self, event: BlockStored, tier: str, owner: Owner
    ) -> tuple[RadixNamespace, Node, int] | None:
        """Insert the event's blocks; (namespace, anchor node, depth of the first block)."""
        if event.parent_block_hash is None:
            ns = self._namespace(event)
            done = self.index.insert(ns, event.token_ids, owner)
            return (ns, done.end, 0) if done.end is not None else None
        parent = self._blocks.get((tier, event.parent_block_hash))
        if parent is None:
            return None
        done_at = self.index.insert_at(Position(parent.anchor, parent.end), event.token_ids, owner)
        if done_at is None:  # the parent's node is gone: rebuild its path from the chain
            path = self._path(tier, event.parent_block_hash)
            if path is None:
                return None
            done_at = self.index.insert(parent.ns, path + event.token_ids, owner)
        return (parent.ns, done_at.end, parent.end) if done_at.end is not None else None

    def _namespace(self, event: BlockStored) -> RadixNamespace:
        """Events do not name the model: the backend's base model (the first by name, should
        it serve several under different names)."""
        adapter = event.lora_name or ""
        models = self._base_models()
        return RadixNamespace(
            models[0] if models else "", adapter, _salt(event.extra_keys, adapter)
        )

    def _check(self, event: BlockStored) -> None:
        size = event.block_size
        if size <= 0 or size % self.index.page_size:
            raise EventFormatError(
                f"block size {size} is not a multiple of the router's page size "
                f"{self.index.page_size} (set router.prefix.index.page_size to divide it)"
            )
        if len(event.token_ids) != len(event.block_hashes) * size:
            raise EventFormatError(
                f"BlockStored has {len(event.token_ids)} token ids for "
                f"{len(event.block_hashes)} blocks of {size}: token ids are required"
            )

    # -- removed ---------------------------------------------------------------------------
    def _removed(self, event: BlockRemoved) -> None:
        tier = medium_tier(event.medium)
        owner = Owner(self.backend_id, tier)
        for block_hash in event.block_hashes:
            ref = self._blocks.pop((tier, block_hash), None)
            if ref is None:
                continue
            self.stats.removed += 1
            start = ref.end - len(ref.tokens)
            if self.index.remove_at(Position(ref.anchor, start), owner) is None:
                path = self._path(tier, block_hash, ref)
                if path is not None:
                    self.index.remove(ref.ns, path, owner, start)

    def _path(
        self, tier: str, block_hash: BlockHash, ref: BlockRef | None = None
    ) -> list[int] | None:
        """The tokens from the root to the end of a block, from the parent chain."""
        parts: list[list[int]] = []
        key: BlockHash | None = block_hash
        while key is not None:
            current = (
                ref if ref is not None and key == block_hash else self._blocks.get((tier, key))
            )
            if current is None:
                return None
            parts.append(current.tokens)
            key = current.parent
        return [t for part in reversed(parts) for t in part]


def _salt(extra_keys: list[Any] | None, adapter: str) -> str:
    """The cache salt among the first block's untagged extra keys (after the LoRA name)."""
    if not extra_keys or not extra_keys[0]:
        return ""
    keys = list(extra_keys[0])
    if adapter and keys and keys[0] == adapter:
        keys = keys[1:]
    return next((k for k in keys if isinstance(k, str)), "")
