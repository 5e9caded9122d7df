"""vLLM's prefix-cache block hashes (``--prefix-caching-hash-algo sha256_cbor``), reimplemented.

vLLM hashes block ``i`` of a request as::

    NONE_HASH = sha256(cbor(seed))                  # seed: PYTHONHASHSEED, else "vllm-none-hash"
    hash[i]   = sha256(cbor((hash[i-1] or NONE_HASH, tuple(block_tokens), extra_keys)))

with canonical CBOR, and publishes ``int.from_bytes(hash, "big") & (2**64 - 1)`` in KV events
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default). ``extra_keys`` is ``None`` or a tuple
of tagged keys: ``("lora", name, path)`` on every block of a LoRA request, then
``("cache_salt", salt)`` on the first block of a salted request. Only full blocks are hashed.

This module writes the few CBOR shapes involved by hand (vLLM uses ``cbor2``); a test checks
every hash against vLLM's own function and against hashes captured from a real engine.
Differences: multimodal and prompt-embedding extra keys are not modelled (the simulator serves
text only).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any, NewType

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

# CBOR heads for token ids below 65536 (the common case), precomputed.
_SMALL_INTS = [
    bytes([i]) if i < 24 else (b"\x18" + bytes([i]) if i < 256 else b"\x19" + i.to_bytes(2, "big"))
    for i in range(1 << 16)
]
_NULL = b"\xf6"
# (parent, block tokens, extra keys) -> hash: prompts sharing a prefix hash it once.
_MEMO: dict[tuple[bytes, tuple[int, ...], bytes], BlockHash] = {}
_MEMO_LIMIT = 1 << 18


def _head(major: int, length: int) -> bytes:
    base = major << 5
    if length < 24:
        return bytes([base | length])
    if length < 1 << 8:
        return bytes([base | 24, length])
    if length < 1 << 16:
        return bytes([base | 25]) + struct.pack(">H", length)
    if length < 1 << 32:
        return bytes([base | 26]) + struct.pack(">I", length)
    return bytes([base | 27]) + struct.pack(">Q", length)


def cbor(value: Any) -> bytes:
    """Canonical CBOR of ints, str, bytes, None, bool, tuples and lists (what vLLM hashes)."""
    if value is None:
        return _NULL
    if value is True or value is False:
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        if 0 <= value < 1 << 16:
            return _SMALL_INTS[value]
        return _head(0, value) if value >= 0 else _head(1, -1 - value)
    if isinstance(value, bytes):
        return _head(2, len(value)) + value
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return _head(3, len(raw)) + raw
    if isinstance(value, (tuple, list)):
        return _head(4, len(value)) + b"".join(cbor(v) for v in value)
    raise TypeError(f"cannot CBOR-encode {type(value).__name__}")


def _token_array(tokens: Sequence[int]) -> bytes:
    small = _SMALL_INTS
    try:
        body = b"".join([small[t] for t in tokens])
    except IndexError:  # an id >= 65536: fall back to the general encoder
        body = b"".join(cbor(t) for t in tokens)
    return _head(4, len(tokens)) + body


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
    tail = None if lora is None else cbor(block_extra_keys(lora, None, False))
    memo = _MEMO
    for index in range(start_block, len(tokens) // block_size):
        begin = index * block_size
        if tail is None or (cache_salt and index == 0):
            extra = cbor(block_extra_keys(lora, cache_salt, index == 0))
        else:
            extra = tail
        block = tuple(tokens[begin : begin + block_size])
        key = (prev, block, extra)
        found = memo.get(key)
        if found is None:
            payload = b"\x83\x58\x20" + prev + _token_array(block) + extra
            found = memo[key] = BlockHash(hashlib.sha256(payload).digest())
            if len(memo) > _MEMO_LIMIT:  # bounded: shared prefixes are re-hashed rarely
                memo.clear()
        prev = found
        out.append(prev)
    return out


def external_hash(block_hash: bytes) -> int:
    """The 64-bit integer vLLM publishes in KV events for a block hash."""
    return int.from_bytes(block_hash[-8:], "big")
