"""The chunk format: header round trip, compression, and every kind of damage is detected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstack.errors import ChunkFormatError
from kvstack.kv.format import (
    DTYPES,
    HEADER_BYTES,
    compress,
    decompress,
    encode_header,
    parse_header,
    payload_checksum,
)
from kvstack.kv.keys import ChunkKey
from kvstack.kv.seal import ChunkSealer, SealFields
from kvstack.kv.tensors import byte_view, dtype_name, torch_dtype
from kvstack.kv.tiers.file import chunkfile

KEY = ChunkKey(bytes(range(16)))
OTHER = ChunkKey(bytes(range(1, 17)))


def _chunk(
    dtype: torch.dtype = torch.float16, shape: tuple[int, ...] = (2, 2, 4, 2, 8)
) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


def _write(
    root: Path,
    chunk: torch.Tensor,
    compression: str = "none",
    key: ChunkKey = KEY,
    sealer: ChunkSealer | None = None,
) -> Path:
    raw = byte_view(chunk)
    stored = compress(raw, compression)
    dtype, shape = dtype_name(chunk.dtype), tuple(chunk.shape)

    def header_for(checksum: int, seal: SealFields | None) -> bytes:
        return encode_header(key, dtype, shape, stored, len(raw), compression, checksum, seal)

    path = chunkfile.chunk_path(root, key)
    (root / chunkfile.TMP_DIR).mkdir(parents=True, exist_ok=True)
    chunkfile.write_chunk_file(
        path, chunkfile.temp_path(root, key), stored, header_for, fsync=False, sealer=sealer,
        key=key,
    )  # fmt: skip
    return path


def _read(
    path: Path, like: torch.Tensor, key: ChunkKey = KEY, sealer: ChunkSealer | None = None
) -> torch.Tensor:
    out = torch.empty_like(like)
    with open(path, "rb", buffering=0) as f:
        header = chunkfile.read_header(f, key)
        assert header.dtype == dtype_name(like.dtype) and header.shape == tuple(like.shape)
        chunkfile.read_payload_into(f, header, byte_view(out), sealer)
    return out


def test_checksum_computed_while_writing_matches_the_payload(tmp_path: Path) -> None:
    chunk = _chunk(torch.float32, (3, 2, 700, 2, 64))  # several I/O blocks and a partial one
    path = _write(tmp_path, chunk)
    header = parse_header(path.read_bytes()[:HEADER_BYTES], KEY)
    assert header.checksum == payload_checksum(byte_view(chunk))
    assert torch.equal(_read(path, chunk), chunk)


@pytest.mark.parametrize("dtype", [torch_dtype(name) for name in DTYPES])
def test_header_round_trip_for_every_dtype(dtype: torch.dtype) -> None:
    chunk = _chunk(dtype)
    raw = byte_view(chunk)
    header = parse_header(
        encode_header(KEY, dtype_name(dtype), tuple(chunk.shape), raw, len(raw)), KEY
    )
    assert (header.key, header.dtype, header.shape) == (KEY, dtype_name(dtype), tuple(chunk.shape))
    assert header.stored_bytes == header.raw_bytes == len(raw)


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_file_round_trip(tmp_path: Path, compression: str) -> None:
    chunk = _chunk(torch.bfloat16, (4, 2, 64, 2, 16))
    path = _write(tmp_path, chunk, compression)
    assert torch.equal(_read(path, chunk), chunk)
    zeros = torch.zeros(4096, dtype=torch.float16)
    size = _write(tmp_path, zeros, compression, key=OTHER).stat().st_size
    assert (size < 1000) == (compression != "none")
    assert torch.equal(_read(chunkfile.chunk_path(tmp_path, OTHER), zeros, key=OTHER), zeros)


def test_truncation_at_every_length_is_detected(tmp_path: Path) -> None:
    chunk = _chunk()
    path = _write(tmp_path, chunk)
    data = path.read_bytes()
    for cut in [0, 1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 1, len(data) - 1]:
        path.write_bytes(data[:cut])
        with pytest.raises(ChunkFormatError):
            _read(path, chunk)
    path.write_bytes(data + b"\x00")  # oversized: trailing garbage
    with pytest.raises(ChunkFormatError):
        _read(path, chunk)


@settings(max_examples=60, deadline=None)
@given(
    compression=st.sampled_from(["none", "zstd", "lz4"]),
    position=st.floats(0, 1),
    bit=st.integers(0, 7),
)
def test_any_bit_flip_is_detected(tmp_path_factory: pytest.TempPathFactory, compression: str,
                                  position: float, bit: int) -> None:  # fmt: skip
    root = tmp_path_factory.mktemp("flip")
    chunk = _chunk()
    path = _write(root, chunk, compression)
    data = bytearray(path.read_bytes())
    index = min(int(position * len(data)), len(data) - 1)
    if 108 <= index < HEADER_BYTES:
        return  # padding and the (unset) MAC tag: not covered by checksums and never read
    data[index] ^= 1 << bit
    path.write_bytes(bytes(data))
    with pytest.raises(ChunkFormatError):
        _read(path, chunk)


def test_foreign_files_and_wrong_keys_are_rejected(tmp_path: Path) -> None:
    chunk = _chunk()
    path = _write(tmp_path, chunk)
    with pytest.raises(ChunkFormatError, match="does not match the requested key"):
        _read(path, chunk, key=OTHER)
    for junk in (
        b"\x89PNG\r\n\x1a\n" + bytes(200),
        os.urandom(HEADER_BYTES + 64),
        b"KVSC" + bytes(HEADER_BYTES - 4),
    ):
        path.write_bytes(junk)
        with pytest.raises(ChunkFormatError):
            _read(path, chunk)


def test_bad_header_inputs_raise_value_error() -> None:
    raw = byte_view(_chunk())
    with pytest.raises(ValueError, match="unsupported KV dtype 'complex64'"):
        encode_header(KEY, "complex64", (1,), raw, len(raw))
    with pytest.raises(ValueError, match="unknown compression 'gzip'"):
        encode_header(KEY, "float16", (1,), raw, len(raw), "gzip")
    with pytest.raises(ValueError, match="out of range"):
        encode_header(KEY, "float16", (1,) * 9, raw, len(raw))


def test_decompress_failures_are_format_errors() -> None:
    with pytest.raises(ChunkFormatError, match="zstd payload does not decompress"):
        decompress(b"not zstd at all", "zstd", 100)
    with pytest.raises(ChunkFormatError, match="lz4 payload does not decompress"):
        decompress(b"not lz4 at all", "lz4", 100)
    good = compress(memoryview(bytes(1000)), "zstd")
    with pytest.raises(ChunkFormatError, match="decompresses to more than the 999 bytes"):
        decompress(good, "zstd", 999)
