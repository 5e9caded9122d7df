"""Chunk keys: how token sequences become deterministic, content-addressed cache keys.

Tokens are cut into chunks of ``chunk_size`` tokens. The key of chunk ``i`` is::

    key[-1] = namespace digest
    key[i]  = BLAKE2b-128(key[i-1] ‖ u32le(len(chunk_i)) ‖ u32le(tokens of chunk i))

so a key names a chunk *and* everything before it: equal keys mean equal prefixes. The namespace
digest covers the model fingerprint, KV dtype, layout version, tensor-parallel rank and size,
the LoRA adapter (``id@version``) and the cache salt, so different models, adapters or tenants
never share a key. BLAKE2b is a cryptographic hash over canonical little-endian bytes: keys are
identical across processes, machines and ``PYTHONHASHSEED`` values, and a tenant cannot craft a
prompt whose key collides with another's. This module is the single owner of key computation;
the connector, the router, the index service and the simulator all call it.

Partial trailing chunks (``partial=True``): a trailing chunk shorter than ``chunk_size`` gets a
key over its exact tokens (its length is hashed, so it never equals a full chunk's key). It is
therefore found only by a prompt that ends with exactly the same partial chunk — the "same
prompt again" case — never by a longer prompt that merely starts with those tokens.
"""

from __future__ import annotations

import array
import hashlib
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NewType

__all__ = [
    "KEY_BYTES",
    "ChunkKey",
    "Namespace",
    "chunk_keys",
    "chunk_spans",
    "iter_chunk_keys",
    "token_bytes",
]

KEY_BYTES = 16
ChunkKey = NewType("ChunkKey", bytes)
_TOKEN_BYTES = 4
_LEN = struct.Struct("<I")
_NAMESPACE_TAG = b"kvstack-namespace-v1"


@dataclass(frozen=True, slots=True)
class Namespace:
    """Everything besides the tokens that decides whether two KV chunks are interchangeable."""

    model: str
    kv_dtype: str = "auto"
    layout_version: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    adapter: str = ""  # "adapter_id@version", or "" for the base model
    salt: str = ""  # tenant isolation; "" for none

    def digest(self) -> ChunkKey:
        """The 16-byte seed of the key chain (deterministic; length-prefixed fields)."""
        h = hashlib.blake2b(_NAMESPACE_TAG, digest_size=KEY_BYTES)
        fields = (
            self.model,
            self.kv_dtype,
            str(self.layout_version),
            str(self.tp_rank),
            str(self.tp_size),
            self.adapter,
            self.salt,
        )
        for field in fields:
            raw = field.encode("utf-8")
            h.update(_LEN.pack(len(raw)))
            h.update(raw)
        return ChunkKey(h.digest())


def token_bytes(tokens: Sequence[int] | Any) -> memoryview:
    """Canonical bytes of ``tokens``: unsigned 32-bit little-endian integers.

    Accepts a sequence of ints, or a one-dimensional numpy array or torch tensor of integers
    (converted without a Python-level loop). Raises ``ValueError`` naming the problem for
    non-integers, negatives, values >= 2**32, ``str``/``bytes`` or arrays of another rank.
    """
    if isinstance(tokens, (str, bytes, bytearray, memoryview)):
        raise ValueError(f"token ids must be a sequence of integers, got {type(tokens).__name__}")
    if hasattr(tokens, "numpy") and hasattr(tokens, "dtype"):  # a torch tensor
        tensor: Any = tokens
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            raise ValueError(f"token ids must be integers, got a tensor of dtype {tensor.dtype}")
        tokens = tensor.detach().cpu().numpy()
    if hasattr(tokens, "dtype") and hasattr(tokens, "ndim"):  # a numpy array
        return _array_token_bytes(tokens)
    try:
        arr = array.array("I", tokens)
    except TypeError as exc:
        raise ValueError(f"token ids must be integers: {exc}") from None
    except OverflowError:
        bad = next(t for t in tokens if not 0 <= t < 2**32)
        raise ValueError(f"token id {bad} is out of range [0, 2**32)") from None
    if arr.itemsize != _TOKEN_BYTES:  # pragma: no cover - platforms with a 2-byte "I"
        arr = array.array("L", arr)
    if sys.byteorder == "big":  # pragma: no cover - canonical form is little-endian
        arr.byteswap()
    return memoryview(arr).cast("B")


def _array_token_bytes(tokens: Any) -> memoryview:
    import numpy as np

    if tokens.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got an array of dtype {tokens.dtype}")
    if tokens.ndim != 1:
        raise ValueError(f"token ids must be one-dimensional, got shape {tuple(tokens.shape)}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= 2**32):
        bad = int(tokens.min()) if int(tokens.min()) < 0 else int(tokens.max())
        raise ValueError(f"token id {bad} is out of range [0, 2**32)")
    canonical: Any = np.ascontiguousarray(tokens, dtype="<u4")
    return memoryview(canonical).cast("B")


def chunk_spans(num_tokens: int, chunk_size: int, partial: bool = False) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` token spans of the chunks of a ``num_tokens`` prompt."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    end_full = num_tokens - num_tokens % chunk_size
    spans = [(s, s + chunk_size) for s in range(0, end_full, chunk_size)]
    if partial and end_full < num_tokens:
        spans.append((end_full, num_tokens))
    return spans


def chunk_keys(
    tokens: Sequence[int] | Any,
    namespace: Namespace | bytes,
    chunk_size: int,
    partial: bool = False,
) -> list[ChunkKey]:
    """Keys of the chunks of ``tokens`` (full chunks; plus the trailing partial one if asked)."""
    return list(iter_chunk_keys(tokens, namespace, chunk_size, partial))


def iter_chunk_keys(
    tokens: Sequence[int] | Any,
    namespace: Namespace | bytes,
    chunk_size: int,
    partial: bool = False,
) -> Iterator[ChunkKey]:
    """:func:`chunk_keys` one key at a time, so that a caller can use the first keys while the
    rest are hashed (the Valkey index sends a prompt's first lookups before hashing its end).
    Bad tokens or a bad namespace raise here, before the first key."""
    raw = token_bytes(tokens)
    prev = namespace.digest() if isinstance(namespace, Namespace) else bytes(namespace)
    if len(prev) != KEY_BYTES:
        raise ValueError(f"a namespace digest is {KEY_BYTES} bytes, got {len(prev)}")
    return _key_chain(raw, prev, chunk_spans(len(raw) // _TOKEN_BYTES, chunk_size, partial))


def _key_chain(raw: memoryview, prev: bytes, spans: list[tuple[int, int]]) -> Iterator[ChunkKey]:
    # The length prefix is packed once per chunk size (every chunk but a partial last one has
    # the same): a tenth of hashing a 128K-token prompt's 512 keys was packing it again.
    blake2b, pack = hashlib.blake2b, _LEN.pack
    size, packed = -1, b""
    for start, end in spans:
        if end - start != size:
            size = end - start
            packed = pack(size)
        h = blake2b(prev, digest_size=KEY_BYTES)
        h.update(packed)
        h.update(raw[start * _TOKEN_BYTES : end * _TOKEN_BYTES])
        prev = h.digest()
        yield ChunkKey(prev)
