"""The chunk format on remote stores: one value (or object) = 96-byte header + stored payload.

Writers send the header and the payload as separate buffers (no concatenation copy). Readers
parse the header first, decide whether the payload can land directly in the caller's tensor
(same dtype and shape, no compression, contiguous CPU memory), and verify the payload checksum
before reporting a hit: a mismatch is :class:`~kvstack.errors.ChunkFormatError`, which tiers
turn into a miss (and delete the value).
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import Literal, NamedTuple

from kvstack.errors import ChunkFormatError
from kvstack.kv.format import (
    HEADER_BYTES,
    ChunkHeader,
    compress,
    decompress,
    encode_header,
    parse_header,
    payload_checksum,
)
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import byte_view, dtype_name, torch, torch_dtype

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
]


Outcome = Literal["hit", "miss", "mismatch", "corrupt", "moved"]


class ReadResult(NamedTuple):
    """One chunk read from a remote: ``hit`` (``chunk`` holds it), ``miss``, ``mismatch``
    (stored with another dtype or shape), ``corrupt`` (dropped; ``detail`` says why) or
    ``moved`` (a Redis Cluster slot moved)."""

    outcome: Outcome
    chunk: torch.Tensor | None = None  # the tensor read into (``out`` or a new one)
    detail: str = ""


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


def encode_chunk(key: ChunkKey, chunk: torch.Tensor, compression: str = "none") -> EncodedChunk:
    if chunk.device.type != "cpu" or not chunk.is_contiguous():
        chunk = chunk.to("cpu").contiguous()
    raw = byte_view(chunk)
    stored = compress(raw, compression)
    header = encode_header(
        key, dtype_name(chunk.dtype), tuple(chunk.shape), stored, len(raw), compression
    )
    return EncodedChunk(header, stored)


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


def decode_payload(header: ChunkHeader, target: PayloadTarget, out: torch.Tensor) -> None:
    """Verify the received payload and, unless it landed in ``out`` directly, decode it there.
    Raises ChunkFormatError on a checksum or size mismatch (``out`` is then undefined)."""
    if payload_checksum(target.view) != header.checksum:
        raise ChunkFormatError("payload checksum mismatch")
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


def _copy_bytes_into(raw: bytes | memoryview, out: torch.Tensor) -> None:
    if not len(raw):
        return
    writable = raw if isinstance(raw, memoryview) and not raw.readonly else bytearray(raw)
    staging = torch.frombuffer(writable, dtype=torch.uint8)
    out.copy_(staging.view(out.dtype).view(out.shape))


def finish(header: ChunkHeader, target: PayloadTarget, out: torch.Tensor) -> ReadResult:
    """Verify (and decode) a received payload: a hit, or corrupt."""
    try:
        decode_payload(header, target, out)
    except ChunkFormatError as exc:
        return ReadResult("corrupt", detail=str(exc))
    return ReadResult("hit", out)


Pending = ReadResult | Future[ReadResult]


def finish_later(
    verifier: Executor | None, header: ChunkHeader, target: PayloadTarget, out: torch.Tensor
) -> Pending:
    """:func:`finish` on ``verifier`` (so the next payload is received while this one is
    checksummed; xxhash releases the GIL), or right away without one."""
    if verifier is None:
        return finish(header, target, out)
    return verifier.submit(finish, header, target, out)


def settle(results: list[Pending]) -> list[ReadResult]:
    return [r.result() if isinstance(r, Future) else r for r in results]


def check_header(buf: bytes | bytearray | memoryview, key: ChunkKey) -> ChunkHeader:
    """Parse a header and check it names ``key`` (ChunkFormatError otherwise)."""
    if len(buf) < HEADER_BYTES:
        raise ChunkFormatError(f"value of {len(buf)} bytes is shorter than a chunk header")
    return parse_header(buf[:HEADER_BYTES], expect_key=key)
