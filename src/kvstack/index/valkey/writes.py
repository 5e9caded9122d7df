"""Reports and upkeep against Valkey: what an engine's announcer does there.

A report takes two round trips: a registry script (:data:`~.scripts.REGISTER` for a reset,
:data:`~.scripts.REFRESH` otherwise) checks the epoch and the report sequence and returns the
bits of the engine's locations; then one pipeline sets or clears those bits in the chunk
entries (:data:`~.scripts.APPLY`, a batch of keys per bucket per call) and commits the new
sequence. A sequence that does not match (the writes of an earlier report were lost, as after a
failover to a replica that had not received them) is answered ``resync``, like an index server
that restarted, and the engine announces everything again.

Upkeep (:meth:`IndexWriter.maintain`) runs every ``maintain_s`` from some writer holding a short
lock: engines silent past the TTL are forgotten and their bits retired; retired bits are
cleared from their chunks a batch at a time, then freed for reuse.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from kvstack.index.protocol import AnnounceBatch, EventReply, TierInfo
from kvstack.index.valkey.layout import KeyLayout
from kvstack.index.valkey.reads import Command, Flow
from kvstack.index.valkey.registry import InstanceInfo
from kvstack.index.valkey.scripts import APPLY, CLEAN, COMMIT, EXPIRE, FREE, REFRESH, REGISTER
from kvstack.index.valkey.url import ValkeyIndexOptions

__all__ = ["IndexWriter"]

log = logging.getLogger(__name__)
APPLY_BATCH = 1024  # keys per script call: bounds how long one call holds the server
CLEAN_BATCH = 10_000
CLEAN_ROUNDS = 8  # per bit and upkeep step
_ENCODER = msgspec.msgpack.Encoder()
_TIERS = msgspec.msgpack.Decoder(list[TierInfo])


@dataclass
class _Reporter:
    """What a writer remembers of one engine it reports for."""

    sequence: int | None = None
    tiers: dict[str, TierInfo] = field(default_factory=dict)


class IndexWriter:
    def __init__(self, layout: KeyLayout, options: ValkeyIndexOptions) -> None:
        self.layout = layout
        self.options = options
        self._reporters: dict[str, _Reporter] = {}
        self._registry = [*layout.registry[:13]]

    # -- reports ---------------------------------------------------------------------------
    def report(self, batch: AnnounceBatch) -> Flow[EventReply]:
        reporter = self._reporters.setdefault(batch.instance, _Reporter())
        tiers = {t.name: t for t in batch.tiers} or reporter.tiers
        if not tiers and not batch.reset:  # another process's engine: its tiers as registered
            (raw,) = yield [("HGET", self.layout.registry_key("T"), batch.instance)]
            tiers = {t.name: t for t in _TIERS.decode(raw)} if raw else {}
        touched = {*batch.stored, *batch.removed}
        local = sorted({n for n, t in tiers.items() if not t.shared} | touched - set(tiers))
        stores = sorted({t.location or t.name for t in tiers.values() if t.shared})
        ((status, epoch, *rest),) = yield [self._check(batch, reporter, local, stores)]
        if status == b"resync":
            reporter.sequence = None
            return EventReply(epoch.decode(), resync=True)
        local_bits, shared_bits, sequence = json.loads(rest[0]), json.loads(rest[1]), int(rest[2])
        writes = list(self._writes(batch, tiers, local_bits, shared_bits))
        commit = (
            "EVAL",
            COMMIT,
            2,
            self.layout.registry_key("I"),
            self.layout.registry_key("Q"),
            batch.instance,
            str(sequence + 1),
        )
        yield [*writes, commit]
        reporter.sequence, reporter.tiers = sequence + 1, tiers
        return EventReply(epoch.decode())

    def _check(
        self, batch: AnnounceBatch, reporter: _Reporter, local: list[str], stores: list[str]
    ) -> Command:
        info = _ENCODER.encode(InstanceInfo(batch.profile, batch.aliases, batch.peer))
        tiers = _ENCODER.encode(batch.tiers) if batch.tiers or batch.reset else b""
        head = ("EVAL", REGISTER if batch.reset else REFRESH, len(self._registry))
        args = (
            batch.instance,
            info,
            tiers,
            json.dumps(local),
            json.dumps(stores),
            uuid.uuid4().hex,
        )
        if batch.reset:
            return (*head, *self._registry, *args)
        expected = "*" if reporter.sequence is None else str(reporter.sequence)
        return (*head, *self._registry, *args, batch.epoch, expected)

    def _writes(
        self,
        batch: AnnounceBatch,
        tiers: dict[str, TierInfo],
        local_bits: dict[str, int],
        shared_bits: dict[str, int],
    ) -> Iterable[Command]:
        for flag, changes in ((b"1", batch.stored), (b"0", batch.removed)):
            for tier, keys in changes.items():
                info = tiers.get(tier)
                if info is not None and info.shared:
                    bit = shared_bits[info.location or tier]
                else:
                    bit = local_bits[tier]
                yield from self._apply(bit, flag, keys)

    def _apply(self, bit: int, flag: bytes, keys: list[bytes]) -> Iterable[Command]:
        for bucket, members in self.layout.by_bucket(keys).items():
            prefix = self.layout.chunk_prefix(bucket)
            held = self.layout.holdings(bucket, bit)
            for start in range(0, len(members), APPLY_BATCH):
                part = members[start : start + APPLY_BATCH]
                yield ("EVAL", APPLY, 1, held, bit, flag, len(prefix), *[prefix + k for k in part])

    # -- upkeep ----------------------------------------------------------------------------
    def maintain(self) -> Flow[list[str]]:
        """Expire silent engines and clean up after them; returns the engines forgotten."""
        lock_ms = int(self.options.maintain_s * 1000)
        lock = self.layout.registry_key("G")
        (got,) = yield [("SET", lock, uuid.uuid4().hex, b"NX", b"PX", lock_ms)]
        if not got:
            return []
        ttl_ms, quarantine_ms = (
            int(self.options.instance_ttl_s * 1000),
            int(self.options.instance_ttl_s * 1000),
        )
        ((gone, retired),) = yield [
            ("EVAL", EXPIRE, len(self._registry), *self._registry, ttl_ms, quarantine_ms)
        ]
        for raw in retired[:4]:
            yield from self._clean(int(raw))
        return [g.decode() for g in gone]

    def _clean(self, bit: int) -> Flow[None]:
        buckets = range(self.layout.buckets)
        for _ in range(CLEAN_ROUNDS):
            left = yield [
                (
                    "EVAL",
                    CLEAN,
                    1,
                    self.layout.holdings(b, bit),
                    bit,
                    self.layout.chunk_prefix(b),
                    CLEAN_BATCH,
                )
                for b in buckets
            ]
            if not any(left):
                x, f = self.layout.registry_key("X"), self.layout.registry_key("F")
                yield [("EVAL", FREE, 2, x, f, bit)]
                log.info("valkey index: location bit %d cleaned and freed", bit)
                return
