"""Which chunks a request loads and saves: the engine-independent part of the connector.

Engines address KV in blocks of ``block_size`` tokens; kvstack stores chunks of ``chunk_size``
tokens (a multiple of the block size), so chunk ``i`` covers blocks
``[i * blocks_per_chunk, (i + 1) * blocks_per_chunk)`` of the request's block table.

A :class:`RequestTracker` follows one request on the scheduler side: its tokens (a live view:
the prompt, then every token the engine generates), its chunk keys (one chain per
tensor-parallel rank, extended as full chunks appear), its block table, what the engine has
computed and what is already known to be stored. From it come :class:`ChunkIO` transfer items:
loads for the part of the sequence found in kvstack beyond the engine's own prefix-cache hit,
saves for full chunks once the engine has computed them. Generated tokens are chunked like the
prompt (``save_generated``): a preempted request, or the next turn of a chat whose prompt is
this one plus its answer, then finds them. Only full chunks are saved, and only once every
token's KV is computed; the last token of a finished request never has KV, so a chunk ending
on it is never saved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstack.kv.keys import chunk_keys

__all__ = ["ChunkIO", "RequestIO", "RequestTracker", "block_aligned_hit"]


@dataclass
class ChunkIO:
    """One chunk to move between kvstack and the engine's paged KV.

    ``block_ids`` lists the engine blocks of the chunk from ``first_block`` on (a load may skip
    blocks the engine already holds and stop before blocks it will compute itself)."""

    chunk: int  # chunk index within the request's tokens
    keys: tuple[bytes, ...]  # the chunk's key for each TP rank
    block_ids: list[int]
    first_block: int = 0
    tokens: list[int] | None = None  # saves: the chunk's tokens, for KV events
    parent: bytes | None = None  # saves: key of the previous chunk (rank 0), for KV events
    generated: bool = False  # saves: the chunk holds generated tokens (not only prompt)


@dataclass
class RequestIO:
    req_id: str
    chunks: list[ChunkIO]
    lora_name: str | None = None


def block_aligned_hit(hit_tokens: int, num_tokens: int, block_size: int) -> int:
    """Tokens that may be loaded: the hit, never the last token, whole blocks only."""
    limit = max(num_tokens - 1, 0)
    usable = min(hit_tokens, limit)
    return usable - usable % block_size


@dataclass
class RequestTracker:
    req_id: str
    tokens: Sequence[int]  # live: grows as the engine appends generated tokens
    num_prompt_tokens: int
    seeds: Sequence[bytes]  # the key chain's seed (namespace digest) for each TP rank
    chunk_size: int
    block_size: int
    lora_name: str | None = None
    save_generated: bool = True
    keys: list[list[bytes]] = field(default_factory=list)  # keys[rank][chunk], grown lazily
    block_ids: list[int] = field(default_factory=list)
    next_save_chunk: int = 0  # chunks below this are stored or were planned for saving
    load_start: int = 0  # tokens [load_start, load_end) are to be loaded
    load_end: int = 0
    max_computed: int = 0  # the most tokens the engine ever had computed (preemption resets)

    @property
    def blocks_per_chunk(self) -> int:
        return self.chunk_size // self.block_size

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_full_chunks(self) -> int:
        """Full chunks of the tokens known now (prompt and generated)."""
        return len(self.tokens) // self.chunk_size

    def lookup_keys(self) -> list[list[bytes]]:
        """Per rank, the keys of every full chunk of the tokens known now."""
        count = self._extend_keys(self.num_full_chunks)
        return [rank_keys[:count] for rank_keys in self.keys]

    def chunk_keys(self, chunk: int) -> tuple[bytes, ...]:
        self._extend_keys(chunk + 1)
        return tuple(rank_keys[chunk] for rank_keys in self.keys)

    def _extend_keys(self, num_chunks: int) -> int:
        """Make sure keys exist for the first ``num_chunks`` chunks (chained from the last)."""
        if not self.keys:
            self.keys = [[] for _ in self.seeds]
        have = len(self.keys[0])
        if num_chunks <= have:
            return num_chunks
        size = self.chunk_size
        new_tokens = list(self.tokens[have * size : num_chunks * size])
        for rank, seed in enumerate(self.seeds):
            rank_keys = self.keys[rank]
            previous = rank_keys[-1] if rank_keys else seed
            rank_keys.extend(chunk_keys(new_tokens, previous, size))
        return len(self.keys[0])

    def mark_stored(self, num_chunks: int) -> None:
        """The first ``num_chunks`` chunks are known to be stored already."""
        self.next_save_chunk = max(self.next_save_chunk, num_chunks)

    def forget_stored_from(self, chunk: int) -> None:
        """Chunk ``chunk`` and later ones turned out not to be stored (a load failed): save
        them again once the engine has recomputed them."""
        self.next_save_chunk = min(self.next_save_chunk, chunk)

    def chunks_of_blocks(self, block_ids: set[int]) -> list[int]:
        """Chunk indices whose blocks include any of ``block_ids``."""
        per = self.blocks_per_chunk
        return sorted({i // per for i, b in enumerate(self.block_ids) if b in block_ids})

    def set_load(self, start_token: int, num_tokens: int) -> None:
        self.load_start, self.load_end = start_token, start_token + num_tokens

    def set_blocks(self, block_ids: Sequence[int], replace: bool) -> None:
        if replace:
            self.block_ids = list(block_ids)
        else:
            self.block_ids.extend(block_ids)

    def note_computed(self, before: int, after: int) -> int:
        """The engine computes tokens ``[before, after)`` this step; returns how many of them
        it had computed before (recomputation after a preemption)."""
        again = max(0, min(after, self.max_computed) - before)
        self.max_computed = max(self.max_computed, after)
        return again

    def take_loads(self) -> RequestIO | None:
        """The pending load as transfer items (once), or None."""
        start, end = self.load_start, self.load_end
        self.load_start = self.load_end = 0
        if end <= start:
            return None
        per = self.blocks_per_chunk
        items = []
        for chunk in range(start // self.chunk_size, (end - 1) // self.chunk_size + 1):
            base = chunk * self.chunk_size
            first = (max(start, base) - base) // self.block_size
            last = (min(end, base + self.chunk_size) - base) // self.block_size
            ids = self.block_ids[chunk * per + first : chunk * per + last]
            if len(ids) != last - first:
                raise ValueError(
                    f"request {self.req_id}: block table has {len(self.block_ids)} blocks, "
                    f"too few to load tokens [{start}, {end})"
                )
            items.append(ChunkIO(chunk, self.chunk_keys(chunk), ids, first))
        return RequestIO(self.req_id, items, self.lora_name)

    def take_saves(self, num_computed_after_step: int, with_tokens: bool) -> RequestIO | None:
        """Full chunks whose KV the engine will have computed after this step, not yet saved
        (prompt chunks only when ``save_generated`` is off)."""
        limit = min(num_computed_after_step, len(self.tokens))
        if not self.save_generated:
            limit = min(limit, self.num_prompt_tokens)
        done = limit // self.chunk_size
        per = self.blocks_per_chunk
        items = []
        for chunk in range(self.next_save_chunk, done):
            ids = self.block_ids[chunk * per : (chunk + 1) * per]
            if len(ids) != per:
                break  # block table not yet extended this far
            tokens = parent = None
            keys = self.chunk_keys(chunk)
            if with_tokens:
                tokens = list(self.tokens[chunk * self.chunk_size : (chunk + 1) * self.chunk_size])
                parent = self.keys[0][chunk - 1] if chunk else None
            items.append(ChunkIO(chunk, keys, ids, 0, tokens, parent, self.is_generated(chunk)))
            self.next_save_chunk = chunk + 1
        return RequestIO(self.req_id, items, self.lora_name) if items else None

    def is_generated(self, chunk: int) -> bool:
        """Whether chunk ``chunk`` holds tokens past the prompt."""
        return (chunk + 1) * self.chunk_size > self.num_prompt_tokens
