"""Messages of the cluster KV index service (msgspec structs; JSON or msgpack on the wire).

Engines report with ``POST /events`` (msgpack :class:`AnnounceBatch`, answered by
:class:`EventReply`); routers ask ``POST /lookup`` (:class:`LookupRequest` →
:class:`LookupReply`); peer tiers ask ``POST /locate`` (:class:`LocateRequest` →
:class:`LocateReply`). A refused request is answered :class:`ErrorReply`. Chunk keys are raw
16-byte strings in msgpack and base64 in JSON. The same messages travel over ZMQ, in msgpack
(:mod:`kvstack.index.wire`).

Why HTTP batches rather than a ZMQ PUB stream for events: a report is answered, so an engine
knows its events arrived and learns the index's *epoch* in the answer. An index that restarted
(new epoch) or forgot an engine answers ``resync`` and the engine re-announces everything it
holds — a PUB/SUB stream drops messages silently on a slow or restarted subscriber and needs a
separate replay channel to recover.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from kvstack.kv.keys import KEY_BYTES

__all__ = [
    "AnnounceBatch",
    "ErrorReply",
    "EventReply",
    "InstanceMatch",
    "KeyProfile",
    "LocateReply",
    "LocateRequest",
    "LookupReply",
    "LookupRequest",
    "TierInfo",
]


# Bounds every decoder applies before a message reaches the index: a key is exactly 16 bytes,
# names and lists are short. Keys per report, lookup tokens and instances are configured
# (``index.service``) and checked by the state.
Key = Annotated[bytes, msgspec.Meta(min_length=KEY_BYTES, max_length=KEY_BYTES)]
Name = Annotated[str, msgspec.Meta(max_length=256)]
Names = Annotated[list[Name], msgspec.Meta(max_length=64)]
KeysByTier = Annotated[dict[Name, list[Key]], msgspec.Meta(max_length=32)]


class KeyProfile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What an engine's chunk keys depend on besides tokens, adapter and salt (see
    :class:`kvstack.kv.keys.Namespace`); the index computes keys for lookups from it."""

    model: Name
    chunk_size: int
    kv_dtype: Name = "auto"
    layout_version: int = 1
    tp_size: int = 1
    partial: bool = False


class TierInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Name
    shared: bool = False
    location: Name = ""  # shared tiers: the store's identity, the same from every engine


class AnnounceBatch(msgspec.Struct, forbid_unknown_fields=True):
    instance: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    profile: KeyProfile
    epoch: Name = ""  # the index epoch this engine last saw ("" before its first answer)
    aliases: Names = msgspec.field(default_factory=list)
    peer: Name = ""  # host:port of the engine's peer server, if it lends chunks
    tiers: Annotated[list[TierInfo], msgspec.Meta(max_length=32)] = msgspec.field(
        default_factory=list
    )
    reset: bool = False  # first report of a full sync: forget what the engine held before
    stored: KeysByTier = msgspec.field(default_factory=dict)  # tier -> keys
    removed: KeysByTier = msgspec.field(default_factory=dict)
    # MAC of the instance id under the cluster's "announce" key (kvstack.index.auth); required
    # by an index that has the secret
    token: Name = ""


class EventReply(msgspec.Struct):
    epoch: str
    resync: bool = False  # the index does not know this engine (restart, expiry): full sync


class LookupRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Give ``tokens`` (a list, or ``tokens_u32``: little-endian uint32 bytes, much cheaper to
    decode) with ``model``, or ``chunk_hashes`` directly. The remaining fields override the
    engines' announced key profile (rarely needed)."""

    model: Name = ""
    tokens: list[int] | None = None
    tokens_u32: bytes | None = None
    chunk_hashes: list[str] | None = None  # hex keys, in chain order (checked by keying)
    salt: Name = ""
    adapter: Name = ""
    tp_rank: int = 0
    namespace: Name = ""  # hex namespace digest, instead of model/dtype/layout/tp/adapter/salt
    chunk_size: int = 0
    kv_dtype: Name = ""
    layout_version: int = 0
    tp_size: int = 0


class InstanceMatch(msgspec.Struct):
    matched_tokens: int  # through any tier the engine reads, shared ones included
    matched_chunks: int
    chunk_size: int
    tiers: dict[str, int]  # per tier of the engine: matched tokens
    peer: str = ""


class LookupReply(msgspec.Struct):
    num_tokens: int
    instances: dict[str, InstanceMatch]
    shared: dict[str, int]  # per shared store location: matched tokens


class LocateRequest(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[Key]
    exclude: Name = ""  # the asking engine


class LocateReply(msgspec.Struct):
    peers: list[str]  # engine ids
    addresses: list[str]  # their peer servers, host:port
    holders: list[list[int]]  # per key: indices into peers of engines holding it locally


class ErrorReply(msgspec.Struct):
    error: str  # what is wrong with the request, or why the server failed
