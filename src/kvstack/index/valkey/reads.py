"""Lookups and locates against Valkey, written once for the blocking and the async client.

Each operation is a *flow*: a generator that yields the commands of one round trip (run as one
pipeline), receives their replies, and returns the answer (:mod:`kvstack.index.valkey.connect`
drives it over a blocking or an async connection). A lookup is one round trip: the registry's
version, the server clock and the engines' last report times (one small script), and one
``MGET`` per bucket of the prompt's chunk entries. Only when the registry changed since the
cached snapshot does a second trip fetch it, and the lookup is asked again.

A flow may also yield :class:`Ahead`: commands to send at once, whose replies arrive with the
next round trip's. A lookup sends each ``send_ahead`` keys' ``MGET`` (a URL setting, 128) as
soon as they are hashed, so that Valkey answers the start of a long prompt while the client
hashes its end, and only the last segment's turn is waited for. Measured on the 2-core
reference machine with a 128K-token prompt (512 keys, about 1 ms of hashing), in three paired
runs against one pipelined trip: segments of 128 keys took 0.1-0.35 ms off the lookup's median
and 0.3-0.8 ms off its p99; segments of 64 or 256 keys did no better. ``kvstack bench index``
measures both in every run (its ``valkey_one_trip`` arm). With ``send_ahead=0`` (always in a
Redis Cluster, whose commands go to several nodes) the reader asks for one segment and each
round trip is one redis-py pipeline; a driver given an Ahead anyway sends it with the next trip.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from kvstack.index import answers
from kvstack.index.protocol import LocateReply, LocateRequest, LookupReply, LookupRequest
from kvstack.index.store import chain_runs
from kvstack.index.valkey.layout import KeyLayout, decode_mask
from kvstack.index.valkey.registry import (
    SNAPSHOT,
    LiveView,
    RegistrySnapshot,
    live_view,
    parse_state,
)
from kvstack.index.valkey.scripts import STATE
from kvstack.index.valkey.url import ValkeyIndexOptions
from kvstack.kv.keys import ChunkKey

__all__ = ["Ahead", "Command", "Flow", "IndexReader"]

T = TypeVar("T")
K = TypeVar("K")
Command = tuple[Any, ...]


class Ahead(NamedTuple):
    """Commands to send now; their replies come first among the next round trip's."""

    commands: list[Command]


Flow = Generator["list[Command] | Ahead", list[Any], T]  # an Ahead is sent []
Fetch = tuple[list[Command], list[int]]  # a segment's MGETs, and where its keys' values land


def _segments(keys: Iterator[K], size: int) -> Iterator[list[K]]:
    """``keys`` in lists of ``size`` (all in one list for size 0), taken as they are hashed."""
    if not size:
        yield list(keys)
        return
    while segment := list(itertools.islice(keys, size)):
        yield segment


def _values(replies: Sequence[Sequence[bytes | None]], positions: list[int]) -> list[bytes | None]:
    """The entries of the keys, in the keys' order, from their buckets' ``MGET`` replies."""
    values = replies[0] if len(replies) == 1 else [v for reply in replies for v in reply]
    return [values[p] for p in positions]


def _leading_chain(values: list[bytes | None], live: int) -> list[int]:
    """Holder masks of the leading keys held by some live location (decoded only that far)."""
    chain = []
    for raw in values:
        mask = decode_mask(raw) & live
        if not mask:
            break
        chain.append(mask)
    return chain


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _holders(masks: dict[bytes, int], view: LiveView) -> Callable[[bytes], list[str]]:
    """The engines holding a key in a local tier, from its mask."""

    def holders_of(key: bytes) -> list[str]:
        held = masks[key] & view.live_mask
        return [view.owners[b] for b in _bits(held) if b in view.owners]

    return holders_of


class IndexReader:
    """The reading half of the Valkey index, with its cached registry snapshot."""

    def __init__(self, layout: KeyLayout, options: ValkeyIndexOptions) -> None:
        self.layout = layout
        self.options = options
        self.send_ahead = options.send_ahead  # keys per early MGET; 0: one trip
        self.snapshot: RegistrySnapshot | None = None
        registry = layout.registry
        self._state = ("EVAL", STATE, 2, layout.registry_key("V"), layout.registry_key("S"))
        self._snapshot_command = ("EVAL", SNAPSHOT, len(registry), *registry)

    def refresh(self) -> Flow[RegistrySnapshot]:
        (reply,) = yield [self._snapshot_command]
        self.snapshot = RegistrySnapshot.decode(reply)
        return self.snapshot

    def _current(self) -> Flow[RegistrySnapshot]:
        if self.snapshot is not None:
            return self.snapshot
        return (yield from self.refresh())

    # -- lookup ----------------------------------------------------------------------------
    def lookup(self, request: LookupRequest) -> Flow[LookupReply]:
        snapshot = yield from self._current()
        for attempt in range(2):
            num_tokens, streams = answers.plan_lookup_streams(
                snapshot.instances.values(), request, self.options.max_lookup_tokens
            )
            chains: list[answers.ProfileChain] = []
            fetches: list[list[Fetch]] = []
            pending: list[Command] = [self._state]
            for stream in streams:
                keys: list[ChunkKey] = []
                chain_fetches = []
                for segment in _segments(stream.keys, self.send_ahead):
                    keys += segment
                    commands, positions = self.layout.mget_commands(segment)
                    chain_fetches.append((commands, positions))
                    pending += commands
                    if self.send_ahead:
                        yield Ahead(pending)
                        pending = []
                chains.append(answers.ProfileChain(stream.profile, stream.members, keys))
                fetches.append(chain_fetches)
            replies = yield pending
            state = parse_state(replies[0])
            if state.version != snapshot.version and attempt == 0:
                snapshot = yield from self.refresh()
                continue
            view = live_view(snapshot, state, self.options.instance_ttl_s)
            plan = answers.LookupPlan(num_tokens, chains)
            return self._answer_lookup(plan, view, fetches, replies[1:])
        raise AssertionError("unreachable")

    def _answer_lookup(
        self,
        plan: answers.LookupPlan,
        view: LiveView,
        fetches: list[list[Fetch]],
        replies: list[Any],
    ) -> LookupReply:
        live_ids = {i.id for i in view.instances}
        chains, runs, start = [], [], 0
        for chain, chain_fetches in zip(plan.chains, fetches, strict=True):
            values: list[bytes | None] = []
            for commands, positions in chain_fetches:
                mine, start = replies[start : start + len(commands)], start + len(commands)
                values += _values(mine, positions)
            members = [m for m in chain.members if m.id in live_ids]
            if not members:
                continue
            masks = _leading_chain(values, view.live_mask)
            chains.append(chain._replace(members=members))
            runs.append(chain_runs(masks, answers.lookup_groups(members), view.bits))
        return answers.answer_lookup(answers.LookupPlan(plan.num_tokens, chains), runs)

    # -- locate ----------------------------------------------------------------------------
    def locate(self, request: LocateRequest) -> Flow[LocateReply]:
        snapshot = yield from self._current()
        commands, positions = self.layout.mget_commands(request.keys)
        for attempt in range(2):
            replies = yield [self._state, *commands]
            state = parse_state(replies[0])
            if state.version != snapshot.version and attempt == 0:
                snapshot = yield from self.refresh()
                continue
            view = live_view(snapshot, state, self.options.instance_ttl_s)
            values = _values(replies[1:], positions)
            masks = {key: decode_mask(raw) for key, raw in zip(request.keys, values, strict=True)}
            return answers.answer_locate(view.instances, request, _holders(masks, view))
        raise AssertionError("unreachable")
