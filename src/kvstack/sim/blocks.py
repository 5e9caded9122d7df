"""The simulated paged KV cache: N blocks of B tokens with vLLM's prefix caching.

Like vLLM's ``BlockPool``: free blocks sit in one LRU queue whether or not they still hold a
cached hash (freshly freed blocks go to the tail, allocation takes from the head, so the
least recently freed cached block is evicted first); a cached block that is hit again leaves
the queue; several physical blocks may carry the same hash when two requests computed the
same prefix at once, and each copy reports its own stored and removed events.

Events are ``("stored", hash)`` / ``("removed", hash)`` / ``("cleared", None)`` tuples, taken
by the engine after each step and turned into vLLM KV events.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvstack.sim.hashing import BlockHash

__all__ = ["BlockPool", "KVBlock", "PoolEvent"]

PoolEvent = tuple[Literal["removed", "cleared"], BlockHash | None]


@dataclass(eq=False, slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, dict[int, KVBlock]] = {}
        self._events: list[PoolEvent] = []

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_blocks

    def num_cached(self) -> int:
        return sum(len(copies) for copies in self._cached.values())

    def match_prefix(self, hashes: Sequence[BlockHash]) -> list[KVBlock]:
        """Cached blocks for the longest prefix of ``hashes`` (no side effects)."""
        found: list[KVBlock] = []
        for block_hash in hashes:
            copies = self._cached.get(block_hash)
            if not copies:
                break
            found.append(next(iter(copies.values())))
        return found

    def num_free_after_touch(self, hits: Sequence[KVBlock]) -> int:
        """Free blocks left once ``hits`` are taken out of the free queue."""
        return len(self._free) - sum(1 for b in hits if b.ref_cnt == 0)

    # -- mutations -------------------------------------------------------------------------
    def touch(self, hits: Sequence[KVBlock]) -> None:
        """Take a reference on cached blocks found by :meth:`match_prefix`."""
        for block in hits:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, num: int) -> list[KVBlock] | None:
        """``num`` blocks from the head of the free queue (evicting their cached hashes), or
        None, allocating nothing, if fewer are free."""
        if num > len(self._free):
            return None
        out: list[KVBlock] = []
        for _ in range(num):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def cache(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Register a block that just became full under its hash (prefix-cache insert)."""
        block.block_hash = block_hash
        self._cached.setdefault(block_hash, {})[block.block_id] = block

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference on each block, tail first, so a request's last blocks are
        evicted before its first ones (the shared prefix lives longest)."""
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None

    def reset(self) -> bool:
        """Forget every cached hash (``/reset_prefix_cache``); False if blocks are in use."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self._blocks:
            block.block_hash = None
        self._cached.clear()
        self._events.append(("cleared", None))
        return True

    def take_events(self) -> list[PoolEvent]:
        events, self._events = self._events, []
        return events

    def _evict(self, block: KVBlock) -> None:
        block_hash = block.block_hash
        if block_hash is None:
            return
        copies = self._cached[block_hash]
        del copies[block.block_id]
        if not copies:
            del self._cached[block_hash]
        block.block_hash = None
        self._events.append(("removed", block_hash))

    def check_integrity(self) -> None:
        """Raise AssertionError if the free queue, refs and the hash map disagree."""
        for block in self._blocks:
            assert block.ref_cnt >= 0, f"block {block.block_id} has ref_cnt {block.ref_cnt}"
            in_free = block.block_id in self._free
            assert in_free == (block.ref_cnt == 0), f"block {block.block_id} free/ref mismatch"
            if block.block_hash is not None:
                assert self._cached[block.block_hash].get(block.block_id) is block
        for block_hash, copies in self._cached.items():
            assert copies, f"empty copy set for {block_hash.hex()}"
            assert all(b.block_hash == block_hash for b in copies.values())
