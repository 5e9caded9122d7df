"""The chunk format on remote stores: one value (or object) = 128-byte header + stored payload.

Writers send the header and the payload as separate buffers (no concatenation copy); with a
cluster secret the header carries the chunk's MAC (:mod:`kvstack.kv.seal`). Readers parse the
header first and check its declared sizes (against the caller's tensor, or the tier's
:class:`~kvstack.kv.trust.ChunkTrust` bound) before allocating anything, decide whether the
payload can land directly in the caller's tensor (same dtype and shape, no compression,
contiguous CPU memory), and verify the payload checksum — with a secret, the MAC — before
reporting a hit: a mismatch is :class:`~kvstack.errors.ChunkFormatError`
(:class:`~kvstack.errors.ChunkMACError`), which tiers turn into a miss (and delete the value).
A rejected payload that landed in the caller's tensor leaves it undefined, and the tier reports
a miss, so the caller never uses it.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import Literal, NamedTuple

from kvstack.errors import ChunkFormatError
from kvstack.kv.format import (
    HEADER_BYTES,
    SIGNED_BYTES,
    ChunkHeader,
    compress,
    decompress,
    encode_header,
    parse_header,
    payload_checksum,
    with_tag,
)
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import byte_view, dtype_name, torch, torch_dtype
from kvstack.kv.trust import ChunkTrust

__all__ = [
    "HEADER_BYTES",
    "EncodedChunk",
    "PayloadTarget",
    "ReadResult",
    "check_header",
    "decode_payload",
    "encode_chunk",
    "finish",
    "finish_later",
    "fits",
    "parse_header",
    "payload_target",
    "settle",
    "tensor_for",
    "verify_payload",
]


Outcome = Literal["hit", "miss", "mismatch", "corrupt", "moved"]


class ReadResult(NamedTuple):
    """One chunk read from a remote: ``hit`` (``chunk`` holds it), ``miss``, ``mismatch``
    (stored with another dtype or shape), ``corrupt`` (dropped; ``detail`` says why, ``reason``
    labels it: format, checksum, size, mac) or ``moved`` (a Redis Cluster slot moved)."""

    outcome: Outcome
    chunk: torch.Tensor | None = None  # the tensor read into (``out`` or a new one)
    detail: str = ""
    reason: str = ""

    @classmethod
    def rejected(cls, exc: ChunkFormatError) -> ReadResult:
        return cls("corrupt", detail=str(exc), reason=exc.reason)


class EncodedChunk(NamedTuple):
    header: bytes
    payload: bytes | memoryview

    @property
    def num_bytes(self) -> int:
        return len(self.header) + len(self.payload)


class PayloadTarget(NamedTuple):
    """Where a payload is received: ``view`` is either ``out``'s own bytes (``direct``) or a
    scratch buffer that :func:`decode_payload` decodes into ``out`` afterwards."""

    view: memoryview
    direct: bool


def encode_chunk(
    key: ChunkKey, chunk: torch.Tensor, compression: str = "none", trust: ChunkTrust | None = None
) -> EncodedChunk:
    """Header (sealed when ``trust`` has a sealer) and stored payload of a chunk."""
    if chunk.device.type != "cpu" or not chunk.is_contiguous():
        chunk = chunk.to("cpu").contiguous()
    raw = byte_view(chunk)
    stored = compress(raw, compression)
    dtype, shape = dtype_name(chunk.dtype), tuple(chunk.shape)
    sealer = None if trust is None else trust.sealer
    if sealer is None:
        return EncodedChunk(encode_header(key, dtype, shape, stored, len(raw), compression), stored)
    fields, mac = sealer.begin_seal(key)
    header = encode_header(key, dtype, shape, stored, len(raw), compression, seal=fields)
    mac.update(stored)
    return EncodedChunk(with_tag(header, mac.tag(header[:SIGNED_BYTES])), stored)


def fits(header: ChunkHeader, out: torch.Tensor) -> bool:
    """Whether the stored chunk has ``out``'s dtype and shape."""
    return header.dtype == dtype_name(out.dtype) and header.shape == tuple(out.shape)


def tensor_for(header: ChunkHeader) -> torch.Tensor:
    """An empty tensor of the stored chunk's dtype and shape."""
    return torch.empty(header.shape, dtype=torch_dtype(header.dtype))


def payload_target(header: ChunkHeader, out: torch.Tensor) -> PayloadTarget:
    """Receive straight into ``out`` when the payload is its exact raw bytes."""
    direct = (
        header.compression == "none"
        and out.is_contiguous()
        and out.device.type == "cpu"
        and header.stored_bytes == out.numel() * out.element_size()
    )
    if direct:
        return PayloadTarget(byte_view(out), True)
    return PayloadTarget(memoryview(bytearray(header.stored_bytes)), False)


def decode_payload(
    header: ChunkHeader, target: PayloadTarget, out: torch.Tensor, trust: ChunkTrust | None = None
) -> None:
    """Verify the received payload (its MAC when ``trust`` has a sealer, else its checksum)
    and, unless it landed in ``out`` directly, decode it there. Raises ChunkFormatError on a
    checksum, MAC or size mismatch (``out`` is then undefined)."""
    verify_payload(header, target.view, trust)
    if target.direct:
        return
    if header.compression == "none":
        raw: bytes | memoryview = target.view
    else:
        raw = decompress(target.view, header.compression, header.raw_bytes)
    expected = out.numel() * out.element_size()
    if len(raw) != expected:
        raise ChunkFormatError(f"payload is {len(raw)} bytes, expected {expected}")
    _copy_bytes_into(raw, out)


def verify_payload(
    header: ChunkHeader, payload: bytes | bytearray | memoryview, trust: ChunkTrust | None
) -> None:
    """The MAC with a sealer (it covers the checksum too), else the XXH3 checksum."""
    sealer = None if trust is None else trust.sealer
    if sealer is not None:
        sealer.check(header, payload)
    elif payload_checksum(payload) != header.checksum:
        raise ChunkFormatError("payload checksum mismatch", reason="checksum")


def _copy_bytes_into(raw: bytes | memoryview, out: torch.Tensor) -> None:
    if not len(raw):
        return
    writable = raw if isinstance(raw, memoryview) and not raw.readonly else bytearray(raw)
    staging = torch.frombuffer(writable, dtype=torch.uint8)
    out.copy_(staging.view(out.dtype).view(out.shape))


def finish(
    header: ChunkHeader, target: PayloadTarget, out: torch.Tensor, trust: ChunkTrust | None = None
) -> ReadResult:
    """Verify (and decode) a received payload: a hit, or corrupt."""
    try:
        decode_payload(header, target, out, trust)
    except ChunkFormatError as exc:
        return ReadResult.rejected(exc)
    return ReadResult("hit", out)


Pending = ReadResult | Future[ReadResult]


def finish_later(
    verifier: Executor | None,
    header: ChunkHeader,
    target: PayloadTarget,
    out: torch.Tensor,
    trust: ChunkTrust | None = None,
) -> Pending:
    """:func:`finish` on ``verifier`` (so the next payload is received while this one is
    checksummed; xxhash and OpenSSL's Poly1305 release the GIL), or right away without one."""
    if verifier is None:
        return finish(header, target, out, trust)
    return verifier.submit(finish, header, target, out, trust)


def settle(results: list[Pending]) -> list[ReadResult]:
    return [r.result() if isinstance(r, Future) else r for r in results]


def check_header(
    buf: bytes | bytearray | memoryview, key: ChunkKey, trust: ChunkTrust | None = None
) -> ChunkHeader:
    """Parse a header and check it names ``key`` and declares sizes within ``trust``'s bound
    (ChunkFormatError otherwise)."""
    if len(buf) < HEADER_BYTES:
        raise ChunkFormatError(f"value of {len(buf)} bytes is shorter than a chunk header")
    bound = ChunkTrust().max_chunk_bytes if trust is None else trust.max_chunk_bytes
    return parse_header(buf[:HEADER_BYTES], expect_key=key, max_raw_bytes=bound)
