"""The stored form of a chunk: a fixed 96-byte self-describing header, then the payload.

Header layout (little-endian)::

    0   4s   magic b"KVSC"
    4   u8   format version (1)
    5   u8   dtype code (see DTYPES)
    6   u8   compression id (0 none, 1 zstd, 2 lz4)
    7   u8   ndim (<= 8)
    8   u64  stored payload length in bytes
    16  u64  raw (uncompressed) payload length in bytes
    24  u64  XXH3-64 of the stored payload
    32  16s  chunk key
    48  8*u32 shape (unused dims 0)
    80  u32  XXH32 of bytes 0..80
    84  12x  padding

Readers verify everything: magic, version, header checksum, key, dtype and shape against what
they expect, payload length and checksum. Any mismatch raises :class:`ChunkFormatError`, which
tiers turn into a miss (and drop the entry): wrong KV is never returned.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import xxhash

from kvstack.errors import ChunkFormatError
from kvstack.kv.keys import KEY_BYTES

__all__ = [
    "COMPRESSIONS",
    "DTYPES",
    "HEADER_BYTES",
    "ChunkHeader",
    "compress",
    "decompress",
    "encode_header",
    "parse_header",
    "payload_checksum",
]

MAGIC = b"KVSC"
VERSION = 1
MAX_NDIM = 8
HEADER_BYTES = 96
_FIXED = struct.Struct("<4sBBBBQQQ16s8I")
_HEADER_SUM = struct.Struct("<I")
assert _FIXED.size == 80

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
) -> bytes:
    """Header bytes for a payload ``stored`` (already compressed if ``compression`` says so);
    ``checksum`` is the payload's XXH3-64 when the caller computed it already."""
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
    header_sum = _HEADER_SUM.pack(xxhash.xxh32_intdigest(fixed))
    return fixed + header_sum + bytes(HEADER_BYTES - _FIXED.size - _HEADER_SUM.size)


def parse_header(
    buf: bytes | bytearray | memoryview, expect_key: bytes | None = None
) -> ChunkHeader:
    """Parse and verify a header; raises :class:`ChunkFormatError` on any inconsistency."""
    if len(buf) < HEADER_BYTES:
        raise ChunkFormatError(f"truncated chunk header: {len(buf)} of {HEADER_BYTES} bytes")
    fixed = bytes(buf[: _FIXED.size])
    (header_sum,) = _HEADER_SUM.unpack_from(buf, _FIXED.size)
    if xxhash.xxh32_intdigest(fixed) != header_sum:
        raise ChunkFormatError("chunk header checksum mismatch")
    magic, version, dtype, comp, ndim, stored, raw, checksum, key, *dims = _FIXED.unpack(fixed)
    if magic != MAGIC or version != VERSION:
        raise ChunkFormatError(f"not a kvstack chunk (magic {magic!r}, version {version})")
    if dtype not in _DTYPE_NAMES or comp not in _COMPRESSION_NAMES or ndim > MAX_NDIM:
        raise ChunkFormatError(f"bad chunk header fields dtype={dtype} comp={comp} ndim={ndim}")
    if expect_key is not None and key != expect_key:
        raise ChunkFormatError("chunk key in header does not match the requested key")
    return ChunkHeader(
        key=key,
        dtype=_DTYPE_NAMES[dtype],
        shape=tuple(dims[:ndim]),
        compression=_COMPRESSION_NAMES[comp],
        stored_bytes=stored,
        raw_bytes=raw,
        checksum=checksum,
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
    try:
        if compression == "zstd":
            import zstandard

            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_bytes)
        elif compression == "lz4":
            import lz4.frame

            out = lz4.frame.decompress(data)
        else:
            raise ChunkFormatError(f"cannot decompress codec {compression!r}")
    except ChunkFormatError:
        raise
    except Exception as exc:  # codec errors have no common base class
        raise ChunkFormatError(f"{compression} payload does not decompress: {exc}") from None
    if len(out) != raw_bytes:
        raise ChunkFormatError(f"decompressed {len(out)} bytes, header says {raw_bytes}")
    return bytes(out)
