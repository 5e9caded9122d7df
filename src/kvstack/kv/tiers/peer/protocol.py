"""The peer wire format. Little-endian; one request at a time per connection.

Connect-time handshake, before any request. The server speaks first::

    HELLO   (server)  4s magic b"KVH1", u8 status (0 OK, 2 REFUSED), u8 auth (0 none,
                      1 challenge), 2x, u32 length of a UTF-8 message that follows (REFUSED),
                      16s server nonce
    AUTH    (client)  4s magic b"KVA1", 16s client nonce,
                      16s MAC("peer" key; "client", server nonce, client nonce)
    WELCOME (server)  4s magic b"KVW1", u8 status (0 OK, 2 REFUSED), 3x, u32 message length,
                      16s MAC("peer" key; "server", server nonce, client nonce)

With a cluster secret the server sends ``auth=1`` and answers nothing (no LOOKUP, no GET)
until the client has proven it holds the secret; the client checks the server's proof in turn,
so neither side talks to a non-member. Fresh nonces on both sides make a recorded handshake
useless. A server without a secret sends ``auth=0`` and listens on loopback only (see
:func:`kvstack.security.check_bind`); a client with a secret refuses such a server (its chunks
could not carry MACs anyway). A server over its connection limits answers HELLO REFUSED with
the reason and closes.

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
(1 present, 0 absent) and, if present, the chunk in the chunk format: the 128-byte header
(dtype, shape, key, payload length, XXH3 checksum and, with a secret, the chunk MAC) and the
payload. The receiver checks the header's sizes against the chunk it asked for before reading
the payload, then the checksum or MAC, so a chunk damaged or forged anywhere on the way is a
miss, never loaded.

BUSY (the server is already streaming ``max_streams`` answers) is the back-pressure signal: the
asking engine falls back to its next tier or recomputes instead of queueing behind others.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, NamedTuple

from kvstack.errors import PeerProtocolError
from kvstack.kv.keys import KEY_BYTES, ChunkKey

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = [
    "ANSWER",
    "AUTH",
    "AUTH_CHALLENGE",
    "AUTH_NONE",
    "BAD_REQUEST",
    "BUSY",
    "GET",
    "HELLO",
    "LOOKUP",
    "NONCE_BYTES",
    "OK",
    "REFUSED",
    "REQUEST",
    "WELCOME",
    "Answer",
    "Hello",
    "PeerHeaderError",
    "ProtocolError",
    "Request",
    "check_proof",
    "pack_answer",
    "pack_request",
    "parse_answer",
    "parse_request",
    "prove",
    "split_keys",
]

REQUEST = struct.Struct("<4sBBHI")
ANSWER = struct.Struct("<4sB3xI")
REQUEST_MAGIC, ANSWER_MAGIC = b"KVP1", b"KVR1"
LOOKUP, GET = 1, 2
OK, BUSY, BAD_REQUEST = 0, 1, 2
REFUSED = BAD_REQUEST
OPS = (LOOKUP, GET)
NONCE_BYTES = 16
HELLO = struct.Struct(f"<4sBBxxI{NONCE_BYTES}s")
AUTH = struct.Struct(f"<4s{NONCE_BYTES}s16s")
WELCOME = struct.Struct("<4sB3xI16s")
HELLO_MAGIC, AUTH_MAGIC, WELCOME_MAGIC = b"KVH1", b"KVA1", b"KVW1"
AUTH_NONE, AUTH_CHALLENGE = 0, 1


class Hello(NamedTuple):
    status: int
    auth: int
    message_bytes: int
    nonce: bytes


class PeerHeaderError(PeerProtocolError):
    """A peer sent a chunk header that fails verification (``reason`` as in
    :class:`~kvstack.errors.ChunkFormatError`); its lengths cannot be trusted, so the
    connection is dropped."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


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


def pack_hello(status: int, auth: int, nonce: bytes, message: bytes = b"") -> bytes:
    return HELLO.pack(HELLO_MAGIC, status, auth, len(message), nonce) + message


def parse_hello(buf: bytes | bytearray) -> Hello:
    magic, status, auth, length, nonce = HELLO.unpack(buf)
    if magic != HELLO_MAGIC or status not in (OK, REFUSED) or auth not in (0, 1):
        raise ProtocolError(f"not a kvstack peer server (hello {bytes(buf[:8])!r})")
    return Hello(status, auth, length, nonce)


def prove(keys: ClusterKeys, side: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """``side``'s proof (b"client" or b"server") that it holds the cluster secret."""
    return keys.mac("peer", side, server_nonce, client_nonce)


def check_proof(
    keys: ClusterKeys, side: bytes, tag: bytes, server_nonce: bytes, client_nonce: bytes
) -> bool:
    return keys.check("peer", tag, side, server_nonce, client_nonce)


def split_keys(buf: bytes | bytearray) -> list[ChunkKey]:
    return [ChunkKey(bytes(buf[i : i + KEY_BYTES])) for i in range(0, len(buf), KEY_BYTES)]
