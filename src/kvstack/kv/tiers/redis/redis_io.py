"""Pipelined chunk reads and writes on one RESP connection.

Reads send every ``GET`` in one write, then stream the replies: each value's header is parsed
first, and a payload that matches the caller's tensor is received straight into it. Every reply
is consumed in full whatever its outcome, so the connection stays usable after a miss, a
foreign layout, a corrupt value or a per-key error such as ``MOVED``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

from kvstack.errors import ChunkFormatError
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch
from kvstack.kv.tiers.redis.resp import RespConnection, RespError, pack_command, pack_large
from kvstack.kv.tiers.remote.codec import (
    HEADER_BYTES,
    EncodedChunk,
    Pending,
    ReadResult,
    check_header,
    finish_later,
    fits,
    payload_target,
    settle,
    tensor_for,
)
from kvstack.kv.trust import ChunkTrust

__all__ = ["ReadResult", "delete_batch", "exists_batch", "read_batch", "touch_batch", "write_batch"]


def read_batch(
    conn: RespConnection,
    names: Sequence[bytes],
    keys: Sequence[ChunkKey],
    outs: Sequence[torch.Tensor | None],
    verifier: Executor | None = None,
    trust: ChunkTrust | None = None,
) -> list[ReadResult]:
    """GET every name; fill ``outs[i]`` (or a new tensor where it is None). Payload checksums
    (MACs, with ``trust``'s sealer) run on ``verifier`` while the next values arrive, when one
    is given."""
    conn.send([b"".join(pack_command("GET", name) for name in names)])
    pending = [_read_one(conn, k, o, verifier, trust) for k, o in zip(keys, outs, strict=True)]
    return settle(pending)


def _read_one(
    conn: RespConnection,
    key: ChunkKey,
    out: torch.Tensor | None,
    verifier: Executor | None,
    trust: ChunkTrust | None,
) -> Pending:
    try:
        size = conn.read_bulk_size()
    except RespError as exc:
        return ReadResult("moved" if str(exc).startswith(("MOVED", "ASK")) else "miss")
    if size is None:
        return ReadResult("miss")
    if size < HEADER_BYTES:
        conn.skip(size + 2)
        return ReadResult("corrupt", detail=f"value of {size} bytes")
    head = bytearray(HEADER_BYTES)
    conn.read_into(memoryview(head))
    rest = size - HEADER_BYTES
    try:
        header = check_header(head, key, trust)
        if header.stored_bytes != rest:
            raise ChunkFormatError(f"payload is {rest} bytes, header says {header.stored_bytes}")
    except ChunkFormatError as exc:
        conn.skip(rest + 2)
        return ReadResult.rejected(exc)
    target_tensor = tensor_for(header) if out is None else out
    if not fits(header, target_tensor):
        conn.skip(rest + 2)
        return ReadResult("mismatch")
    target = payload_target(header, target_tensor)
    conn.read_into(target.view)
    conn.skip(2)
    return finish_later(verifier, header, target, target_tensor, trust)


def exists_batch(conn: RespConnection, names: Sequence[bytes]) -> list[bool]:
    replies = conn.pipeline([pack_command("EXISTS", name) for name in names])
    return [reply == 1 for reply in replies]


def write_batch(
    conn: RespConnection,
    names: Sequence[bytes],
    chunks: Sequence[EncodedChunk],
    ttl_ms: int,
) -> list[bool]:
    """SET each value (with a TTL when ``ttl_ms`` > 0) without joining header and payload;
    True for each value the server acknowledged."""
    tail: tuple[str | int, ...] = ("PX", ttl_ms) if ttl_ms > 0 else ()
    for name, chunk in zip(names, chunks, strict=True):
        conn.send(pack_large(("SET", name), (chunk.header, chunk.payload), tail))
    return [conn.read_reply() == b"OK" for _ in names]


def touch_batch(conn: RespConnection, names: Sequence[bytes], ttl_ms: int) -> None:
    """Renew the TTL of values that are already stored (a re-store keeps hot chunks alive)."""
    conn.pipeline([pack_command("PEXPIRE", name, ttl_ms) for name in names])


def delete_batch(conn: RespConnection, names: Sequence[bytes]) -> list[bool]:
    replies = conn.pipeline([pack_command("DEL", name) for name in names])
    return [reply == 1 for reply in replies]
