"""The peer wire format. Little-endian; one request at a time per connection.

Request::

    4s  magic b"KVP1"
    u8  op (1 LOOKUP, 2 GET)
    u8  flags (0)
    u16 reserved (0)
    u32 number of keys
    16 bytes per key

Answer::

    4s  magic b"KVR1"
    u8  status (0 OK, 1 BUSY, 2 BAD REQUEST)
    3x
    u32 num (keys; for BAD REQUEST the length of a UTF-8 message that follows)

then, for an OK LOOKUP, one byte per key (1 held, 0 not); for an OK GET, per key one byte
(1 present, 0 absent) and, if present, the chunk in the chunk format: the 96-byte header
(dtype, shape, key, payload length and XXH3 checksum) and the payload. The receiver verifies
header and checksum, so a chunk damaged anywhere on the way is a miss, never loaded.

BUSY (the server is already streaming ``max_streams`` answers) is the back-pressure signal: the
asking engine falls back to its next tier or recomputes instead of queueing behind others.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kvstack.errors import PeerProtocolError
from kvstack.kv.keys import KEY_BYTES, ChunkKey

__all__ = [
    "ANSWER",
    "BAD_REQUEST",
    "BUSY",
    "GET",
    "LOOKUP",
    "OK",
    "REQUEST",
    "Answer",
    "ProtocolError",
    "Request",
    "pack_answer",
    "pack_request",
    "parse_answer",
    "parse_request",
    "split_keys",
]

REQUEST = struct.Struct("<4sBBHI")
ANSWER = struct.Struct("<4sB3xI")
REQUEST_MAGIC, ANSWER_MAGIC = b"KVP1", b"KVR1"
LOOKUP, GET = 1, 2
OK, BUSY, BAD_REQUEST = 0, 1, 2
OPS = (LOOKUP, GET)


class Request(NamedTuple):
    op: int
    num_keys: int


class Answer(NamedTuple):
    status: int
    num: int  # keys, or the length of a BAD REQUEST message


ProtocolError = PeerProtocolError  # the name this package uses


def pack_request(op: int, keys: list[ChunkKey]) -> bytes:
    return REQUEST.pack(REQUEST_MAGIC, op, 0, 0, len(keys)) + b"".join(keys)


def parse_request(buf: bytes | bytearray) -> Request:
    magic, op, _, _, num_keys = REQUEST.unpack(buf)
    if magic != REQUEST_MAGIC or op not in OPS:
        raise ProtocolError(f"not a peer request (magic {magic!r}, op {op})")
    return Request(op, num_keys)


def pack_answer(status: int, num: int) -> bytes:
    return ANSWER.pack(ANSWER_MAGIC, status, num)


def parse_answer(buf: bytes | bytearray) -> Answer:
    magic, status, num = ANSWER.unpack(buf)
    if magic != ANSWER_MAGIC or status not in (OK, BUSY, BAD_REQUEST):
        raise ProtocolError(f"not a peer answer (magic {magic!r}, status {status})")
    return Answer(status, num)


def split_keys(buf: bytes | bytearray) -> list[ChunkKey]:
    return [ChunkKey(bytes(buf[i : i + KEY_BYTES])) for i in range(0, len(buf), KEY_BYTES)]
