"""Chunk MACs and header bounds at the format level: a sealed chunk verifies under its secret
(and the previous one during a rotation), and anything else is refused before its bytes are used;
declared sizes beyond the layout are refused before anything is allocated for them."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstack.errors import ChunkFormatError, ChunkMACError
from kvstack.kv.format import (
    HEADER_BYTES,
    SIGNED_BYTES,
    compress,
    decompress,
    encode_header,
    parse_header,
)
from kvstack.kv.keys import ChunkKey
from kvstack.kv.seal import ChunkSealer
from kvstack.kv.tensors import byte_view
from kvstack.kv.tiers.remote.codec import check_header, encode_chunk, verify_payload
from kvstack.kv.trust import ChunkTrust
from kvstack.security import ClusterKeys
from tests.kv.test_format import _chunk, _read, _write

KEY = ChunkKey(bytes(range(16)))
SECRET, OTHER = b"a" * 32, b"b" * 32


def trust(secret: bytes = SECRET, previous: bytes | None = None) -> ChunkTrust:
    return ChunkTrust(ChunkSealer(ClusterKeys(secret, previous)))


def test_a_sealed_chunk_verifies_and_a_foreign_or_unsigned_one_is_refused() -> None:
    chunk = _chunk()
    sealed = encode_chunk(KEY, chunk, trust=trust())
    header = check_header(sealed.header, KEY, trust())
    verify_payload(header, sealed.payload, trust())  # no exception: genuine
    with pytest.raises(ChunkMACError, match="another cluster secret"):
        verify_payload(header, sealed.payload, trust(OTHER))
    unsigned = encode_chunk(KEY, chunk)
    with pytest.raises(ChunkMACError, match="carries no MAC"):
        verify_payload(check_header(unsigned.header, KEY), unsigned.payload, trust())
    verify_payload(check_header(unsigned.header, KEY), unsigned.payload, None)  # no secret: fine


def test_an_altered_payload_with_a_recomputed_checksum_is_refused() -> None:
    """The attack XXH3 cannot stop: change the KV, fix the checksum and the header sum."""
    sealed = encode_chunk(KEY, _chunk(), trust=trust())
    payload = bytearray(bytes(sealed.payload))
    payload[10] ^= 0xFF
    forged = _recompute_checksums(sealed.header, payload)
    header = check_header(forged, KEY, trust())  # the header is self-consistent
    assert header.checksum == xxhash.xxh3_64_intdigest(bytes(payload))
    verify_payload(header, payload, None)  # passes the unkeyed checks...
    with pytest.raises(ChunkMACError, match="does not match"):
        verify_payload(header, payload, trust())  # ...not the MAC


def _recompute_checksums(header: bytes, payload: bytes | bytearray) -> bytes:
    out = bytearray(header)
    struct.pack_into("<Q", out, 24, xxhash.xxh3_64_intdigest(bytes(payload)))
    struct.pack_into("<I", out, 104, xxhash.xxh32_intdigest(bytes(out[:104])))
    return bytes(out)


def test_rotation_reads_the_previous_secret_and_signs_with_the_new() -> None:
    chunk = _chunk()
    old = encode_chunk(KEY, chunk, trust=trust(OTHER))
    rotating = trust(SECRET, previous=OTHER)
    verify_payload(check_header(old.header, KEY), old.payload, rotating)
    new = encode_chunk(KEY, chunk, trust=rotating)
    verify_payload(check_header(new.header, KEY), new.payload, trust(SECRET))
    with pytest.raises(ChunkMACError):
        verify_payload(check_header(new.header, KEY), new.payload, trust(OTHER))


@settings(max_examples=40, deadline=None)
@given(
    position=st.floats(0, 1), bit=st.integers(0, 7), compression=st.sampled_from(["none", "lz4"])
)
def test_any_bit_flip_of_a_sealed_file_is_refused(
    tmp_path_factory: pytest.TempPathFactory, position: float, bit: int, compression: str
) -> None:
    root = tmp_path_factory.mktemp("sealed")
    chunk, sealer = _chunk(), ChunkSealer(ClusterKeys(SECRET))
    path = _write(root, chunk, compression, sealer=sealer)
    assert torch.equal(_read(path, chunk, sealer=sealer), chunk)
    data = bytearray(path.read_bytes())
    index = min(int(position * len(data)), len(data) - 1)
    if 108 <= index < SIGNED_BYTES:
        return  # padding between the header sum and the tag: covered by the MAC only
    data[index] ^= 1 << bit
    path.write_bytes(bytes(data))
    with pytest.raises(ChunkFormatError):
        _read(path, chunk, sealer=sealer)


def test_the_padding_before_the_tag_is_covered_by_the_mac(tmp_path: Path) -> None:
    chunk, sealer = _chunk(), ChunkSealer(ClusterKeys(SECRET))
    path = _write(tmp_path, chunk, sealer=sealer)
    data = bytearray(path.read_bytes())
    data[110] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ChunkMACError):
        _read(path, chunk, sealer=sealer)


def _header(shape: tuple[int, ...], stored: int, raw: int, compression: str = "none") -> bytes:
    comp = {"none": 0, "lz4": 2}[compression]
    dims = [*shape, *[0] * (8 - len(shape))]
    fixed = struct.pack("<4sBBBBQQQ16s8I", b"KVSC", 2, 1, comp, len(shape), stored, raw, 0, KEY,
                        *dims)  # fmt: skip
    summed = fixed + bytes(24)
    return summed + struct.pack("<I", xxhash.xxh32_intdigest(summed)) + bytes(20)


def test_declared_sizes_must_match_the_shape_and_stay_within_the_bound() -> None:
    three_gib = 3 << 30
    # a hostile peer's header: 3 GiB declared, consistent with its shape
    hostile = _header((3, 1 << 29), three_gib, three_gib)
    with pytest.raises(ChunkFormatError, match="more than the") as refused:
        parse_header(hostile, KEY, max_raw_bytes=1 << 20)
    assert refused.value.reason == "size"
    lying = _header((4, 4), 1 << 30, 1 << 30)  # 16 float16 values are 32 bytes, not 1 GiB
    with pytest.raises(ChunkFormatError, match="declares") as refused:
        parse_header(lying, KEY)
    assert refused.value.reason == "size"
    bloated = _header((4, 4), 1 << 20, 32, "lz4")  # a "compressed" payload far past the raw size
    with pytest.raises(ChunkFormatError, match="payload of"):
        parse_header(bloated, KEY)
    assert parse_header(_header((4, 4), 32, 32), KEY).raw_bytes == 32


def test_decompression_stops_at_the_declared_size() -> None:
    bomb = compress(memoryview(bytes(64 << 20)), "zstd")  # 64 MiB of zeros in a few KiB
    assert len(bomb) < 64 << 10
    for codec, data in (("zstd", bomb), ("lz4", compress(memoryview(bytes(8 << 20)), "lz4"))):
        with pytest.raises(ChunkFormatError) as refused:
            decompress(data, codec, 4096)
        assert refused.value.reason == "size"


def test_a_header_declaring_more_than_the_caller_accepts_is_refused_before_allocation() -> None:
    raw = byte_view(_chunk())
    header = encode_header(KEY, "float16", (2, 2, 4, 2, 8), raw, len(raw))
    assert len(header) == HEADER_BYTES
    with pytest.raises(ChunkFormatError, match="more than the"):
        check_header(header, KEY, ChunkTrust(max_chunk_bytes=len(raw) - 1))
