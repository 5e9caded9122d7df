"""Chunk MACs: with a cluster secret, every chunk written to a tier carries a keyed tag over its
header and payload, and every read from a tier checks it before the bytes reach an engine.

The tag (format: :mod:`kvstack.kv.format`) is Poly1305 over ``payload ‖ header[0:112]`` (the
header up to the tag itself; its fields are fixed-length, so the input is unambiguous) under a
one-time key ``BLAKE2b(key=K, data=nonce ‖ chunk key)``, where ``K`` is the cluster's
``chunk-mac`` key and ``nonce`` 16 random bytes chosen per write and stored in the header. This
is the construction of ChaCha20-Poly1305 and NaCl's secretbox with BLAKE2b as the PRF: a fresh
one-time key per write, so a tag reveals nothing that forges another. The header names the
signing key by a 4-byte id, so a reader checks under exactly one key, also while a rotation
accepts two secrets (a chunk of an unknown secret is refused without hashing the payload).

Why Poly1305 and not keyed BLAKE2b or HMAC: a chunk is megabytes and the MAC is a pass over
them. Measured on the 2-core CI machine over 4 MiB: Poly1305 (OpenSSL, via ``cryptography``)
5.4-5.9 GB/s, BLAKE3 keyed 1.8-2.3 GB/s, HMAC-SHA-256 (SHA-NI) 1.4 GB/s, keyed BLAKE2b
0.55-0.7 GB/s; XXH3 (unkeyed, forgeable) 31-49 GB/s, a memcpy 18-26 GB/s.

Where the MAC is computed and checked — tier boundaries, not the CPU tier's hot path:

- **Sealed** when bytes leave this process: the file, redis and s3 tiers seal on their
  background writer threads (never on the engine's step), and the peer server seals a chunk
  once when it first serves it (the header is remembered, as its checksum was before).
- **Checked** when bytes enter this process: every read of the file, redis, s3 and peer tiers
  checks the tag before the read counts as a hit; a missing, foreign or wrong tag is a miss,
  counted in ``kvstack_kv_chunks_rejected_total{tier,reason="mac"}`` and logged once per
  incident, and the chunk is dropped from the store that held it.
- **Not checked** on reads of the in-process ``cpu://`` tier. Its arena holds only bytes this
  process computed itself or bytes that passed the check when they were promoted into it, in
  memory no other process can write; anyone who could alter them could read the key from the
  same memory. Checking there would cost every hit a pass at ~5 GB/s against the tier's
  memcpy at 18-26 GB/s (far below its 0.8x bar) and protect against nothing the threat model
  admits. ``kvstack bench kv`` measures the CPU tier with the secret on and off, and the file
  tier (where the MAC is paid) both ways.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
from typing import TYPE_CHECKING, Any

from kvstack.errors import ChunkMACError, require
from kvstack.kv.format import KEY_ID_BYTES, NONCE_BYTES, TAG_BYTES, ChunkHeader, SealFields

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["KEY_ID_BYTES", "NONCE_BYTES", "TAG_BYTES", "ChunkSealer", "MacState", "SealFields"]

PURPOSE = "chunk-mac"


class MacState:
    """One chunk's MAC being computed: feed the payload (in any number of blocks), then
    :meth:`tag` with the header bytes that precede the tag."""

    __slots__ = ("_poly",)

    def __init__(self, key: bytes, nonce: bytes, chunk_key: bytes) -> None:
        one_time = hashlib.blake2b(nonce + chunk_key, key=key, digest_size=32).digest()
        self._poly: Any = _poly1305()(one_time)

    def update(self, block: bytes | bytearray | memoryview) -> None:
        self._poly.update(block)

    def tag(self, signed_header: bytes | bytearray | memoryview) -> bytes:
        self._poly.update(signed_header)
        return bytes(self._poly.finalize())


class ChunkSealer:
    """Seals chunks with the current ``chunk-mac`` key and checks them under the current or,
    during a rotation, the previous one."""

    def __init__(self, keys: ClusterKeys) -> None:
        self.keys = keys
        self._signer = keys.key(PURPOSE)
        self._key_id = _key_id(self._signer)
        self._checkers = {_key_id(k): k for k in keys.verifiers(PURPOSE)}

    def begin_seal(self, chunk_key: bytes) -> tuple[SealFields, MacState]:
        """Fields for a new header and the MAC to feed its payload into."""
        nonce = os.urandom(NONCE_BYTES)
        return SealFields(self._key_id, nonce), MacState(self._signer, nonce, chunk_key)

    def begin_check(self, header: ChunkHeader) -> MacState:
        """The MAC to feed a received payload into; :class:`ChunkMACError` at once when the
        header is unsigned or names a key this cluster does not hold."""
        if header.seal is None:
            raise ChunkMACError("chunk carries no MAC (written without the cluster secret)")
        key = self._checkers.get(header.seal.key_id)
        if key is None:
            raise ChunkMACError("chunk is signed with another cluster secret")
        return MacState(key, header.seal.nonce, header.key)

    @staticmethod
    def finish_check(state: MacState, header: ChunkHeader) -> None:
        """Raise :class:`ChunkMACError` unless the tag matches (compared in constant time)."""
        if not hmac.compare_digest(state.tag(header.signed), header.tag):
            raise ChunkMACError("chunk MAC does not match its header and payload")

    def check(self, header: ChunkHeader, payload: bytes | bytearray | memoryview) -> None:
        """Check a whole received payload at once."""
        state = self.begin_check(header)
        state.update(payload)
        self.finish_check(state, header)

    @property
    def fingerprint(self) -> str:
        return self.keys.fingerprint

    def __repr__(self) -> str:
        return f"ChunkSealer({self.keys!r})"


@functools.cache
def _poly1305() -> Any:
    module: Any = require("cryptography.hazmat.primitives.poly1305", "kv")
    return module.Poly1305


def _key_id(key: bytes) -> bytes:
    return hashlib.blake2b(b"key-id", key=key, digest_size=KEY_ID_BYTES).digest()
