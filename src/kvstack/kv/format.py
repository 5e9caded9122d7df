"""The stored form of a chunk: a fixed 128-byte self-describing header, then the payload.

Header layout (little-endian)::

    0   4s   magic b"KVSC"
    4   u8   format version (2)
    5   u8   dtype code (see DTYPES)
    6   u8   compression id (0 none, 1 zstd, 2 lz4)
    7   u8   ndim (<= 8)
    8   u64  stored payload length in bytes
    16  u64  raw (uncompressed) payload length in bytes
    24  u64  XXH3-64 of the stored payload
    32  16s  chunk key
    48  8*u32 shape (unused dims 0)
    80  u8   MAC scheme (0 none, 1 Poly1305 keyed from the cluster secret: kvstack.kv.seal)
    81  3x   padding
    84  4s   id of the key that signed (zero when unsigned)
    88  16s  nonce of the MAC (zero when unsigned)
    104 u32  XXH32 of bytes 0..104
    108 4x   padding
    112 16s  MAC tag over payload ‖ bytes 0..112 (zero when unsigned)

Readers verify everything before they allocate or read a payload: magic, version, header
checksum, key, dtype and shape against what they expect, and declared sizes against the
layout (the raw length is exactly shape × dtype size, an uncompressed payload is exactly that
long, a compressed one barely longer, and nothing exceeds the reader's bound), so a hostile
header cannot make a reader allocate more than the chunk it asked for. Then the payload
checksum, or with a cluster secret the MAC (:mod:`kvstack.kv.seal`). Any mismatch raises
:class:`ChunkFormatError` (:class:`~kvstack.errors.ChunkMACError` for the MAC), which tiers turn
into a miss (and drop the entry): wrong KV is never returned. Decompression stops at the
declared raw length. Chunks of format 1 (96-byte header, before MACs) read as foreign: a miss.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import xxhash

from kvstack.errors import ChunkFormatError
from kvstack.kv.keys import KEY_BYTES

__all__ = [
    "COMPRESSIONS",
    "DTYPES",
    "HEADER_BYTES",
    "KEY_ID_BYTES",
    "MAX_CHUNK_BYTES",
    "NONCE_BYTES",
    "SIGNED_BYTES",
    "TAG_BYTES",
    "ChunkHeader",
    "SealFields",
    "compress",
    "decompress",
    "encode_header",
    "parse_header",
    "payload_checksum",
    "with_tag",
]

NONCE_BYTES = 16
TAG_BYTES = 16
KEY_ID_BYTES = 4


class SealFields(NamedTuple):
    """What a sealed header records besides the tag: which key signed, with which nonce
    (:mod:`kvstack.kv.seal` computes and checks the tag)."""

    key_id: bytes
    nonce: bytes


MAGIC = b"KVSC"
VERSION = 2
MAX_NDIM = 8
HEADER_BYTES = 128
SIGNED_BYTES = 112  # the header bytes the MAC covers (all but the tag)
# What a reader accepts when it knows nothing better (no layout yet): a chunk of 256 tokens of
# a 405B model in bf16 (126 layers, 16 KV heads per rank, head dim 128) is 126 MiB.
MAX_CHUNK_BYTES = 1 << 30
MAC_NONE, MAC_POLY1305 = 0, 1
_FIXED = struct.Struct("<4sBBBBQQQ16s8I")
_SEAL = struct.Struct(f"<B3x{KEY_ID_BYTES}s{NONCE_BYTES}s")
_HEADER_SUM = struct.Struct("<I")
_SUMMED = _FIXED.size + _SEAL.size
assert _FIXED.size == 80 and _SUMMED == 104 and SIGNED_BYTES + TAG_BYTES == HEADER_BYTES

DTYPES: dict[str, int] = {
    "float16": 1,
    "bfloat16": 2,
    "float32": 3,
    "float8_e4m3fn": 4,
    "float8_e5m2": 5,
    "int8": 6,
    "uint8": 7,
    "float64": 8,
    "int16": 9,
    "int32": 10,
    "int64": 11,
}
_DTYPE_NAMES = {code: name for name, code in DTYPES.items()}
ITEM_BYTES: dict[str, int] = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int8": 1, "uint8": 1, "float64": 8, "int16": 2, "int32": 4, "int64": 8,
}  # fmt: skip
COMPRESSIONS: dict[str, int] = {"none": 0, "zstd": 1, "lz4": 2}
_COMPRESSION_NAMES = {code: name for name, code in COMPRESSIONS.items()}


class ChunkHeader(NamedTuple):
    key: bytes
    dtype: str
    shape: tuple[int, ...]
    compression: str
    stored_bytes: int
    raw_bytes: int
    checksum: int
    seal: SealFields | None = None  # None: written without a cluster secret
    tag: bytes = bytes(TAG_BYTES)
    signed: bytes = b""  # header bytes 0..112, which the MAC covers


def payload_checksum(payload: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(payload)


def encode_header(
    key: bytes,
    dtype: str,
    shape: tuple[int, ...],
    stored: bytes | bytearray | memoryview,
    raw_bytes: int,
    compression: str = "none",
    checksum: int | None = None,
    seal: SealFields | None = None,
) -> bytes:
    """Header bytes for a payload ``stored`` (already compressed if ``compression`` says so);
    ``checksum`` is the payload's XXH3-64 when the caller computed it already. With ``seal``
    the tag is left zero: :func:`with_tag` fills it in once the MAC is computed."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported KV dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r}; known: {', '.join(COMPRESSIONS)}")
    if len(shape) > MAX_NDIM or len(key) != KEY_BYTES:
        raise ValueError(f"chunk shape {shape} or key length {len(key)} out of range")
    fixed = _FIXED.pack(
        MAGIC,
        VERSION,
        DTYPES[dtype],
        COMPRESSIONS[compression],
        len(shape),
        len(stored),
        raw_bytes,
        payload_checksum(stored) if checksum is None else checksum,
        key,
        *shape,
        *([0] * (MAX_NDIM - len(shape))),
    )
    if seal is None:
        sealed = _SEAL.pack(MAC_NONE, bytes(KEY_ID_BYTES), bytes(NONCE_BYTES))
    else:
        sealed = _SEAL.pack(MAC_POLY1305, seal.key_id, seal.nonce)
    summed = fixed + sealed
    header_sum = _HEADER_SUM.pack(xxhash.xxh32_intdigest(summed))
    return summed + header_sum + bytes(SIGNED_BYTES - _SUMMED - _HEADER_SUM.size + TAG_BYTES)


def with_tag(header: bytes, tag: bytes) -> bytes:
    """``header`` with its MAC tag filled in."""
    return header[:SIGNED_BYTES] + tag


def parse_header(
    buf: bytes | bytearray | memoryview,
    expect_key: bytes | None = None,
    max_raw_bytes: int = MAX_CHUNK_BYTES,
) -> ChunkHeader:
    """Parse and verify a header, its declared sizes included (at most ``max_raw_bytes`` of
    raw payload); raises :class:`ChunkFormatError` on any inconsistency."""
    if len(buf) < HEADER_BYTES:
        raise ChunkFormatError(f"truncated chunk header: {len(buf)} of {HEADER_BYTES} bytes")
    signed = bytes(buf[:SIGNED_BYTES])
    (header_sum,) = _HEADER_SUM.unpack_from(signed, _SUMMED)
    if xxhash.xxh32_intdigest(signed[:_SUMMED]) != header_sum:
        raise ChunkFormatError("chunk header checksum mismatch")
    magic, version, dtype, comp, ndim, stored, raw, checksum, key, *dims = _FIXED.unpack_from(
        signed
    )
    if magic != MAGIC or version != VERSION:
        raise ChunkFormatError(f"not a kvstack chunk (magic {magic!r}, version {version})")
    if dtype not in _DTYPE_NAMES or comp not in _COMPRESSION_NAMES or ndim > MAX_NDIM:
        raise ChunkFormatError(f"bad chunk header fields dtype={dtype} comp={comp} ndim={ndim}")
    if expect_key is not None and key != expect_key:
        raise ChunkFormatError("chunk key in header does not match the requested key")
    scheme, key_id, nonce = _SEAL.unpack_from(signed, _FIXED.size)
    if scheme not in (MAC_NONE, MAC_POLY1305):
        raise ChunkFormatError(f"unknown chunk MAC scheme {scheme}")
    header = ChunkHeader(
        key=key,
        dtype=_DTYPE_NAMES[dtype],
        shape=tuple(dims[:ndim]),
        compression=_COMPRESSION_NAMES[comp],
        stored_bytes=stored,
        raw_bytes=raw,
        checksum=checksum,
        seal=SealFields(key_id, nonce) if scheme == MAC_POLY1305 else None,
        tag=bytes(buf[SIGNED_BYTES:HEADER_BYTES]),
        signed=signed,
    )
    check_sizes(header, dims[ndim:], max_raw_bytes)
    return header


def check_sizes(header: ChunkHeader, unused_dims: list[int], max_raw_bytes: int) -> None:
    """The declared lengths agree with the shape and stay within ``max_raw_bytes``: checked
    before anything is allocated for the payload."""
    expected = math.prod(header.shape) * ITEM_BYTES[header.dtype]
    if any(unused_dims) or header.raw_bytes != expected:
        raise ChunkFormatError(
            f"chunk header declares {header.raw_bytes} raw bytes for shape {header.shape} of "
            f"{header.dtype} ({expected} bytes)",
            reason="size",
        )
    if header.raw_bytes > max_raw_bytes:
        raise ChunkFormatError(
            f"chunk header declares {header.raw_bytes} bytes, more than the {max_raw_bytes} "
            "this reader accepts",
            reason="size",
        )
    if header.compression == "none":
        limit = header.raw_bytes
    else:  # zstd and lz4 expand incompressible data by well under 1/128 plus a frame header
        limit = header.raw_bytes + header.raw_bytes // 128 + 1024
    if header.stored_bytes > limit or (
        header.compression == "none" and header.stored_bytes != header.raw_bytes
    ):
        raise ChunkFormatError(
            f"chunk header declares a {header.compression} payload of {header.stored_bytes} "
            f"bytes for {header.raw_bytes} raw bytes",
            reason="size",
        )


def compress(data: memoryview, compression: str, level: int = 1) -> bytes | memoryview:
    """Compress ``data`` with the named codec (``none`` returns it unchanged)."""
    if compression == "none":
        return data
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=level).compress(data)
    if compression == "lz4":
        import lz4.frame

        return bytes(lz4.frame.compress(data, compression_level=level))
    raise ValueError(f"unknown compression {compression!r}; known: {', '.join(COMPRESSIONS)}")


def decompress(data: bytes | bytearray | memoryview, compression: str, raw_bytes: int) -> bytes:
    """Decompress at most ``raw_bytes`` (a frame announcing more is refused, never allocated);
    ChunkFormatError unless exactly ``raw_bytes`` come out."""
    try:
        out = _decompress_bounded(data, compression, raw_bytes)
    except ChunkFormatError:
        raise
    except Exception as exc:  # codec errors have no common base class
        raise ChunkFormatError(f"{compression} payload does not decompress: {exc}") from None
    if len(out) > raw_bytes:
        raise ChunkFormatError(
            f"{compression} payload decompresses to more than the {raw_bytes} bytes the header "
            "says (stopped there)",
            reason="size",
        )
    if len(out) < raw_bytes:
        raise ChunkFormatError(f"decompressed {len(out)} bytes, header says {raw_bytes}")
    return bytes(out)


def _decompress_bounded(
    data: bytes | bytearray | memoryview, compression: str, raw_bytes: int
) -> bytes:
    # One byte more than allowed tells "too long" from "exact" without reading further.
    if compression == "zstd":
        import zstandard

        # Not ZstdDecompressor.decompress: it allocates the content size the frame declares,
        # whatever max_output_size says.
        reader = zstandard.ZstdDecompressor().stream_reader(data)
        parts, got = [], 0
        while got <= raw_bytes:
            part = reader.read(raw_bytes + 1 - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)
    if compression == "lz4":
        import lz4.frame

        decompressor = lz4.frame.LZ4FrameDecompressor()
        return bytes(decompressor.decompress(data, max_length=raw_bytes + 1))
    raise ChunkFormatError(f"cannot decompress codec {compression!r}")
