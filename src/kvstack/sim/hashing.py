"""vLLM's prefix-cache block hashes (``--prefix-caching-hash-algo sha256_cbor``), reimplemented.

vLLM hashes block ``i`` of a request as::

    NONE_HASH = sha256(cbor(seed))                  # seed: PYTHONHASHSEED, else "vllm-none-hash"
    hash[i]   = sha256(cbor((hash[i-1] or NONE_HASH, tuple(block_tokens), extra_keys)))

with canonical CBOR, and publishes ``int.from_bytes(hash, "big") & (2**64 - 1)`` in KV events
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default). ``extra_keys`` is ``None`` or a tuple
of tagged keys: ``("lora", name, path)`` on every block of a LoRA request, then
``("cache_salt", salt)`` on the first block of a salted request. Only full blocks are hashed.

The CBOR is ``cbor2``'s canonical encoding, the library and the call vLLM's ``sha256_cbor``
uses; a test checks every hash against vLLM's own function and against hashes captured from a
real engine. Differences: multimodal and prompt-embedding extra keys are not modelled (the
simulator serves text only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NewType

import cbor2

__all__ = [
    "BlockHash",
    "block_extra_keys",
    "cbor",
    "chain_block_hashes",
    "external_hash",
    "none_hash",
]

BlockHash = NewType("BlockHash", bytes)
ExtraKeys = tuple[tuple[Any, ...], ...] | None

# (parent, block tokens, extra keys) -> hash: prompts sharing a prefix hash it once.
_MEMO: dict[tuple[bytes, tuple[int, ...], ExtraKeys], BlockHash] = {}
_MEMO_LIMIT = 1 << 18


def cbor(value: Any) -> bytes:
    """Canonical CBOR, as vLLM's ``sha256_cbor`` encodes what it hashes."""
    return cbor2.dumps(value, canonical=True)


def none_hash(seed: str) -> BlockHash:
    """The parent hash of the first block (vLLM's ``NONE_HASH``)."""
    return BlockHash(hashlib.sha256(cbor(seed)).digest())


def block_extra_keys(
    lora: tuple[str, str] | None, cache_salt: str | None, first_block: bool
) -> ExtraKeys:
    """vLLM's extra keys of one block: LoRA ``(name, path)`` always, the salt on block 0."""
    keys: list[tuple[Any, ...]] = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    if cache_salt and first_block:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def chain_block_hashes(
    tokens: Sequence[int],
    block_size: int,
    parent: BlockHash,
    start_block: int = 0,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
) -> list[BlockHash]:
    """Hashes of the full blocks of ``tokens`` from block ``start_block`` on, chained on
    ``parent`` (``none_hash(seed)`` for block 0, else the hash of block ``start_block - 1``)."""
    out: list[BlockHash] = []
    prev = parent
    memo = _MEMO
    later = block_extra_keys(lora, cache_salt, first_block=False)
    for index in range(start_block, len(tokens) // block_size):
        begin = index * block_size
        block = tuple(tokens[begin : begin + block_size])
        extra = block_extra_keys(lora, cache_salt, first_block=True) if index == 0 else later
        key = (prev, block, extra)
        found = memo.get(key)
        if found is None:
            found = memo[key] = BlockHash(hashlib.sha256(cbor(key)).digest())
            if len(memo) > _MEMO_LIMIT:  # bounded: shared prefixes are re-hashed rarely
                memo.clear()
        prev = found
        out.append(prev)
    return out


def external_hash(block_hash: bytes) -> int:
    """The 64-bit integer vLLM publishes in KV events for a block hash."""
    return int.from_bytes(block_hash[-8:], "big")
