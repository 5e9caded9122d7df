"""Chunk keys for index lookups, computed exactly as :class:`kvstack.kv.KVCache` computes them.

A cache's namespace is ``Namespace(model, kv_dtype or "auto", layout_version, tp_rank, tp_size,
adapter, salt)`` and its keys are ``chunk_keys(tokens, namespace, chunk_size, partial)``. The
index learns ``model``, ``kv_dtype``, ``layout_version``, ``tp_size``, ``chunk_size`` and
``partial`` from each engine's :class:`~kvstack.index.protocol.KeyProfile`; a lookup brings the
tokens, adapter and salt (and may override the rest). TP rank 0's keys stand for the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from kvstack.errors import ConfigError
from kvstack.index.protocol import KeyProfile, LookupRequest
from kvstack.kv.keys import KEY_BYTES, ChunkKey, Namespace, iter_chunk_keys

__all__ = [
    "effective_profile",
    "iter_lookup_keys",
    "lookup_keys",
    "request_tokens",
    "tokens_matched",
]


def effective_profile(profile: KeyProfile, request: LookupRequest) -> KeyProfile:
    """``profile`` with the request's explicit overrides applied."""
    return KeyProfile(
        model=profile.model,
        chunk_size=request.chunk_size or profile.chunk_size,
        kv_dtype=request.kv_dtype or profile.kv_dtype,
        layout_version=request.layout_version or profile.layout_version,
        tp_size=request.tp_size or profile.tp_size,
        partial=profile.partial,
    )


def request_tokens(request: LookupRequest, max_tokens: int) -> Any:
    """The request's tokens as a uint32 array (or a list), None if it names chunk hashes."""
    if request.tokens_u32 is not None:
        if len(request.tokens_u32) % 4:
            raise ConfigError(
                f"tokens_u32 has {len(request.tokens_u32)} bytes, not a multiple of 4"
            )
        tokens: Any = np.frombuffer(request.tokens_u32, dtype="<u4")
    elif request.tokens is not None:
        tokens = request.tokens
    else:
        return None
    if len(tokens) > max_tokens:
        raise ConfigError(f"lookup of {len(tokens)} tokens exceeds the limit of {max_tokens}")
    return tokens


def lookup_keys(profile: KeyProfile, request: LookupRequest, tokens: Any) -> list[ChunkKey]:
    """The chain of keys the request names under ``profile``."""
    return list(iter_lookup_keys(profile, request, tokens))


def iter_lookup_keys(
    profile: KeyProfile, request: LookupRequest, tokens: Any
) -> Iterator[ChunkKey]:
    """:func:`lookup_keys` one key at a time (hashed as they are taken); bad input raises here."""
    if tokens is None:
        return iter(_hex_keys(request.chunk_hashes or []))
    if request.namespace:
        seed = _hex_key(request.namespace, "namespace")
    else:
        seed = Namespace(
            profile.model,
            profile.kv_dtype or "auto",
            profile.layout_version,
            request.tp_rank,
            profile.tp_size,
            request.adapter,
            request.salt,
        ).digest()
    return iter_chunk_keys(tokens, seed, profile.chunk_size, profile.partial)


def tokens_matched(num_chunks: int, chunk_size: int, num_tokens: int | None) -> int:
    """Tokens covered by the first ``num_chunks`` chunks (a trailing partial chunk counts its
    real length)."""
    covered = num_chunks * chunk_size
    return covered if num_tokens is None else min(covered, num_tokens)


def _hex_keys(hashes: list[str]) -> list[ChunkKey]:
    return [_hex_key(h, f"chunk_hashes[{i}]") for i, h in enumerate(hashes)]


def _hex_key(text: str, what: str) -> ChunkKey:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"{what} is not hex: {text[:40]!r}") from None
    if len(raw) != KEY_BYTES:
        raise ConfigError(f"{what} must be {KEY_BYTES} bytes ({2 * KEY_BYTES} hex digits)")
    return ChunkKey(raw)
