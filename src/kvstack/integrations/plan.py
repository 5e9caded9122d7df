"""Which chunks a request loads and saves: the engine-independent part of the connector.

Engines address KV in blocks of ``block_size`` tokens; kvstack stores chunks of ``chunk_size``
tokens (a multiple of the block size), so chunk ``i`` covers blocks
``[i * blocks_per_chunk, (i + 1) * blocks_per_chunk)`` of the request's block table.

A :class:`RequestTracker` follows one request on the scheduler side: its prompt, its chunk keys
(one list per tensor-parallel rank), its block table, what the engine has computed and what is
already known to be stored. From it come :class:`ChunkIO` transfer items: loads for the part of
the prompt found in kvstack beyond the engine's own prefix-cache hit, saves for full prompt
chunks once the engine has computed them. Only full chunks inside the prompt are ever saved:
their KV comes from prefill, so loading them reproduces recomputation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["ChunkIO", "RequestIO", "RequestTracker", "block_aligned_hit"]


@dataclass
class ChunkIO:
    """One chunk to move between kvstack and the engine's paged KV.

    ``block_ids`` lists the engine blocks of the chunk from ``first_block`` on (a load may skip
    blocks the engine already holds and stop before blocks it will compute itself)."""

    chunk: int  # chunk index within the prompt
    keys: tuple[bytes, ...]  # the chunk's key for each TP rank
    block_ids: list[int]
    first_block: int = 0
    tokens: list[int] | None = None  # saves: the chunk's tokens, for KV events
    parent: bytes | None = None  # saves: key of the previous chunk (rank 0), for KV events


@dataclass
class RequestIO:
    req_id: str
    chunks: list[ChunkIO]
    lora_name: str | None = None


def block_aligned_hit(hit_tokens: int, num_prompt_tokens: int, block_size: int) -> int:
    """Tokens that may be loaded: the hit, never the last prompt token, whole blocks only."""
    limit = max(num_prompt_tokens - 1, 0)
    usable = min(hit_tokens, limit)
    return usable - usable % block_size


@dataclass
class RequestTracker:
    req_id: str
    prompt: list[int]
    keys: Sequence[Sequence[bytes]]  # keys[rank][chunk]
    chunk_size: int
    block_size: int
    lora_name: str | None = None
    block_ids: list[int] = field(default_factory=list)
    next_save_chunk: int = 0  # chunks below this are stored or were planned for saving
    load_start: int = 0  # tokens [load_start, load_end) are to be loaded this step
    load_end: int = 0

    @property
    def blocks_per_chunk(self) -> int:
        return self.chunk_size // self.block_size

    @property
    def num_full_chunks(self) -> int:
        return len(self.prompt) // self.chunk_size

    def chunk_keys(self, chunk: int) -> tuple[bytes, ...]:
        return tuple(rank_keys[chunk] for rank_keys in self.keys)

    def mark_stored(self, num_chunks: int) -> None:
        """The first ``num_chunks`` chunks are known to be stored already."""
        self.next_save_chunk = max(self.next_save_chunk, num_chunks)

    def set_load(self, start_token: int, num_tokens: int) -> None:
        self.load_start, self.load_end = start_token, start_token + num_tokens

    def set_blocks(self, block_ids: Sequence[int], replace: bool) -> None:
        if replace:
            self.block_ids = list(block_ids)
        else:
            self.block_ids.extend(block_ids)

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
        """Full prompt chunks the engine will have computed after this step, not yet saved."""
        done = min(num_computed_after_step, len(self.prompt)) // self.chunk_size
        per = self.blocks_per_chunk
        items = []
        for chunk in range(self.next_save_chunk, done):
            ids = self.block_ids[chunk * per : (chunk + 1) * per]
            if len(ids) != per:
                break  # block table not yet extended this far
            tokens = parent = None
            if with_tokens:
                tokens = self.prompt[chunk * self.chunk_size : (chunk + 1) * self.chunk_size]
                parent = self.keys[0][chunk - 1] if chunk else None
            items.append(ChunkIO(chunk, self.chunk_keys(chunk), ids, 0, tokens, parent))
            self.next_save_chunk = chunk + 1
        return RequestIO(self.req_id, items, self.lora_name) if items else None
