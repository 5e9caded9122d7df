"""How a ``lookup`` and a ``locate`` are answered from engines and chunk holders, whatever stores
them: the index server's memory (:class:`~kvstack.index.state.IndexState`) or Valkey
(:mod:`kvstack.index.valkey`). Both backends call these functions, so that the same event stream
gives the same answers on both (the contract test in ``tests/index/test_backend_contract.py``).

A lookup is answered in two steps, so that a remote backend can fetch every chain it needs in
one round trip between them::

    plan = plan_lookup(instances, request, max_tokens)      # key chains, one per key profile
    runs = [prefix_runs(chain.keys, lookup_groups(chain.members)) for chain in plan.chains]
    reply = answer_lookup(plan, runs)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from kvstack.index import keying
from kvstack.index.protocol import (
    InstanceMatch,
    KeyProfile,
    LocateReply,
    LocateRequest,
    LookupReply,
    LookupRequest,
    TierInfo,
)
from kvstack.index.store import Location
from kvstack.kv.keys import ChunkKey

__all__ = [
    "ChainStream",
    "InstanceView",
    "LookupPlan",
    "ProfileChain",
    "answer_locate",
    "answer_lookup",
    "lookup_groups",
    "plan_lookup",
    "plan_lookup_streams",
]


class InstanceView(Protocol):
    """What answers need of an engine (:class:`kvstack.index.state.Instance` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def profile(self) -> KeyProfile: ...

    @property
    def peer(self) -> str: ...

    @property
    def tiers(self) -> Mapping[str, TierInfo]: ...

    def location(self, tier: str) -> Location: ...

    def locations(self, shared: bool | None = None) -> list[Location]: ...

    def serves(self, model: str) -> bool: ...


class ProfileChain(NamedTuple):
    """The engines sharing one effective key profile, and the prompt's key chain under it."""

    profile: KeyProfile
    members: list[InstanceView]
    keys: list[ChunkKey]


class LookupPlan(NamedTuple):
    num_tokens: int | None  # None: the request named chunk hashes, not tokens
    chains: list[ProfileChain]


def plan_lookup(
    instances: Iterable[InstanceView], request: LookupRequest, max_tokens: int
) -> LookupPlan:
    """The engines a lookup asks about, grouped by key profile, with each group's key chain."""
    num_tokens, streams = plan_lookup_streams(instances, request, max_tokens)
    chains = [ProfileChain(s.profile, s.members, list(s.keys)) for s in streams]
    return LookupPlan(num_tokens, chains)


class ChainStream(NamedTuple):
    """A :class:`ProfileChain` whose keys are hashed as they are taken."""

    profile: KeyProfile
    members: list[InstanceView]
    keys: Iterator[ChunkKey]


def plan_lookup_streams(
    instances: Iterable[InstanceView], request: LookupRequest, max_tokens: int
) -> tuple[int | None, list[ChainStream]]:
    """:func:`plan_lookup` with each key chain left to hash as it is read: the number of
    tokens (None for chunk hashes) and the streams. Bad input raises here."""
    tokens = keying.request_tokens(request, max_tokens)
    candidates = [
        i for i in instances if not request.model or request.namespace or i.serves(request.model)
    ]
    by_profile: dict[KeyProfile, list[InstanceView]] = {}
    for instance in candidates:
        profile = keying.effective_profile(instance.profile, request)
        by_profile.setdefault(profile, []).append(instance)
    streams = [
        ChainStream(profile, members, keying.iter_lookup_keys(profile, request, tokens))
        for profile, members in by_profile.items()
    ]
    return (None if tokens is None else len(tokens)), streams


def lookup_groups(members: Sequence[InstanceView]) -> dict[str, list[Location]]:
    """The location groups whose prefix runs a lookup needs: each engine (every tier it reads),
    each engine's tier, and each shared store (named ``"\\0" + store``)."""
    groups: dict[str, list[Location]] = {}
    for instance in members:
        groups[instance.id] = instance.locations()
        for tier in instance.tiers:
            groups[f"{instance.id}\0{tier}"] = [instance.location(tier)]
        for location in instance.locations(shared=True):
            groups[f"\0{location.tier}"] = [location]
    return groups


def answer_lookup(plan: LookupPlan, runs: Sequence[dict[str, int]]) -> LookupReply:
    """The reply, from each chain's prefix runs (in chunks) of :func:`lookup_groups`."""
    reply = LookupReply(num_tokens=plan.num_tokens or 0, instances={}, shared={})
    for chain, chain_runs in zip(plan.chains, runs, strict=True):
        _answer_chain(chain, chain_runs, plan.num_tokens, reply)
    return reply


def _answer_chain(
    chain: ProfileChain, runs: dict[str, int], num_tokens: int | None, reply: LookupReply
) -> None:
    chunk_size = chain.profile.chunk_size

    def matched(chunks: int) -> int:
        return keying.tokens_matched(chunks, chunk_size, num_tokens)

    for instance in chain.members:
        reply.instances[instance.id] = InstanceMatch(
            matched_tokens=matched(runs[instance.id]),
            matched_chunks=runs[instance.id],
            chunk_size=chunk_size,
            tiers={t: matched(runs[f"{instance.id}\0{t}"]) for t in instance.tiers},
            peer=instance.peer,
        )
    for name, run in runs.items():
        if name.startswith("\0"):
            reply.shared[name[1:]] = max(reply.shared.get(name[1:], 0), matched(run))


def answer_locate(
    instances: Iterable[InstanceView],
    request: LocateRequest,
    holders_of: Callable[[bytes], Iterable[Any]],
) -> LocateReply:
    """Which engines (other than the asker) lend each key from a local tier; ``holders_of(key)``
    gives the holder ids (an engine's id, or a shared store's marker) of one key."""
    lending = [i for i in instances if i.peer and i.id != request.exclude]
    lenders = {instance.id: n for n, instance in enumerate(lending)}
    reply = LocateReply(
        peers=[i.id for i in lending], addresses=[i.peer for i in lending], holders=[]
    )
    for key in request.keys:
        held = {lenders[h] for h in holders_of(key) if h in lenders}
        reply.holders.append(sorted(held))
    return reply
