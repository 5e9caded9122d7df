"""The index backends give the same answers: one seeded event stream (stores, removals, resets,
heartbeats, a refresh without tiers, an unlisted tier, shared stores, two models, adapters and
salts) goes to the index server (over HTTP, a real server on a thread) and to Valkey (a real
redis-server, standalone and as a 3-master Cluster); after every step every lookup and locate
is asked of both and compared. Silent engines expire alike, and a few answers are checked
against hand-computed values, so that both being wrong in the same way fails too."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
import pytest

from kvstack.index.backend import IndexBackend, backend_name, open_index
from kvstack.index.client import lookup_request
from kvstack.index.config import IndexServiceConfig
from kvstack.index.protocol import AnnounceBatch, KeyProfile, LocateReply, TierInfo
from kvstack.index.runner import IndexServerThread
from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys
from kvstack.stack.ports import free_port
from tests.index.conftest import valkey_index_url
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = pytest.mark.redis

CHUNK = 4
TOY = KeyProfile(model="toy@1", chunk_size=CHUNK)
OTHER = KeyProfile(model="other@1", chunk_size=2 * CHUNK, kv_dtype="bfloat16")
SHARED = TierInfo("redis", shared=True, location="redis://store:6379/0/kv:")
SHARED_2 = TierInfo("s3", shared=True, location="s3://bucket/kv")
ENGINES: dict[str, tuple[KeyProfile, list[TierInfo], str]] = {
    "e0": (TOY, [TierInfo("cpu"), TierInfo("file"), SHARED], "10.0.0.1:8400"),
    "e1": (TOY, [TierInfo("cpu"), SHARED, SHARED_2], "10.0.0.2:8400"),
    "e2": (TOY, [TierInfo("cpu")], ""),
    "e3": (OTHER, [TierInfo("cpu"), SHARED], "10.0.0.4:8400"),
}
NAMESPACES = [("", ""), ("ad@1", ""), ("", "tenant-a")]  # (adapter, salt)


def prompts(rng: random.Random) -> list[list[int]]:
    """A tree of prompts: shared stems with branches of different lengths."""
    stems = [[rng.randrange(50_000) for _ in range(6 * CHUNK)] for _ in range(2)]
    out = []
    for stem in stems:
        for cut in (2, 4, 6):
            out.append(stem[: cut * CHUNK] + [rng.randrange(50_000) for _ in range(5 * CHUNK)])
    return out


def keys_of(profile: KeyProfile, tokens: list[int], adapter: str, salt: str) -> list[ChunkKey]:
    ns = Namespace(profile.model, profile.kv_dtype, 1, 0, 1, adapter, salt)
    return chunk_keys(tokens, ns, profile.chunk_size)


@dataclass
class Twin:
    """One client per backend and each engine's epoch on each."""

    clients: dict[str, IndexBackend]
    readers: dict[str, IndexBackend] = field(default_factory=dict)  # asked, never reported to
    epochs: dict[tuple[str, str], str] = field(default_factory=dict)

    def report(self, batch: AnnounceBatch) -> None:
        for name, client in self.clients.items():
            sent = msgspec.structs.replace(batch, epoch=self.epochs.get((name, batch.instance), ""))
            reply = client.report(sent)
            assert not reply.resync, f"{name} asked {batch.instance} for a resync"
            self.epochs[(name, batch.instance)] = reply.epoch

    def same_lookup(self, **request: object) -> dict[str, object]:
        answers = {
            name: msgspec.to_builtins(client.lookup(lookup_request(**request)))  # type: ignore[arg-type]
            for name, client in {**self.clients, **self.readers}.items()
        }
        first, *_ = answers.values()
        for name, answer in answers.items():
            assert answer == first, f"{name} answers {answer}, expected {first} ({request})"
        return first  # type: ignore[no-any-return]

    def same_locate(self, keys: list[ChunkKey], exclude: str) -> list[list[str]]:
        asked = {**self.clients, **self.readers}
        answers = {n: _holders(c.locate(keys, exclude)) for n, c in asked.items()}
        first, *_ = answers.values()
        for name, answer in answers.items():
            assert answer == first, f"{name} locates {answer}, expected {first}"
        return first


def _holders(reply: LocateReply) -> list[list[str]]:
    """Per key, the holders' ids and addresses (the order of ``peers`` is not part of it)."""
    return [sorted(f"{reply.peers[i]}@{reply.addresses[i]}" for i in h) for h in reply.holders]


@pytest.fixture
def twin(valkey_url: str) -> Iterator[Twin]:
    server = IndexServerThread(IndexServiceConfig(port=free_port())).start()
    clients = {"service": open_index(server.url), "valkey": open_index(valkey_url)}
    assert backend_name(valkey_url) == "valkey" and backend_name(server.url) == "service"
    readers: dict[str, IndexBackend] = {}
    if "cluster=true" not in valkey_url:
        # Early MGETs of 3 keys: the prompts' 11 chunks go in 4 segments (the default's 128
        # send them in one); and none sent early, one pipeline a trip (as in a cluster).
        readers["valkey-3-ahead"] = open_index(f"{valkey_url}&send_ahead=3")
        readers["valkey-one-trip"] = open_index(f"{valkey_url}&send_ahead=0")
    yield Twin(clients, readers)
    for client in {**clients, **readers}.values():
        client.close()
    server.stop()


def batch(name: str, reset: bool = False, **changes: dict[str, list[bytes]]) -> AnnounceBatch:
    profile, tiers, peer = ENGINES[name]
    aliases = ["toy"] if profile is TOY else ["other"]
    return AnnounceBatch(instance=name, profile=profile, aliases=aliases, peer=peer, tiers=tiers,
                         reset=reset, **changes)  # fmt: skip


def step(twin: Twin, rng: random.Random, tree: list[list[int]]) -> None:
    name = rng.choice(list(ENGINES))
    profile, tiers, _ = ENGINES[name]
    tokens = rng.choice(tree)
    adapter, salt = rng.choice(NAMESPACES)
    keys = keys_of(profile, tokens, adapter, salt)[: rng.randint(1, 11)]
    tier = rng.choice([*(t.name for t in tiers), "gpu-extra"])  # one tier is never listed
    kind = rng.random()
    if kind < 0.5:
        twin.report(batch(name, stored={tier: list(keys)}))
    elif kind < 0.75:
        twin.report(batch(name, removed={tier: rng.sample(list(keys), k=len(keys) // 2)}))
    elif kind < 0.85:
        twin.report(batch(name, reset=True, stored={tier: list(keys[:3])}))
    elif kind < 0.93:
        quiet = batch(name)
        quiet.tiers = []  # a refresh without tiers keeps the registered ones
        quiet.stored = {tiers[0].name: list(keys[-2:])}
        twin.report(quiet)
    else:
        twin.report(batch(name))  # a heartbeat


def ask_everything(twin: Twin, rng: random.Random, tree: list[list[int]]) -> None:
    for tokens in tree:
        for adapter, salt in NAMESPACES:
            twin.same_lookup(model="toy", tokens=tokens, adapter=adapter, salt=salt)
        twin.same_lookup(model="other", tokens=tokens)
    twin.same_lookup(model="", tokens=tree[0])  # every engine
    twin.same_lookup(model="nobody", tokens=tree[0])
    twin.same_lookup(model="toy", tokens=tree[0][: CHUNK - 1])  # no whole chunk: no keys
    twin.same_lookup(model="toy", chunk_hashes=[])
    keys = keys_of(TOY, tree[1], "", "")
    twin.same_lookup(model="toy", chunk_hashes=keys)
    for exclude in ["", *ENGINES]:
        twin.same_locate(keys_of(TOY, rng.choice(tree), "", "")[:8], exclude)
    assert twin.same_locate([], "") == []


def test_one_event_stream_gives_the_same_answers_on_both_backends(twin: Twin) -> None:
    rng = random.Random(19)
    tree = prompts(rng)
    for name in ENGINES:
        twin.report(batch(name, reset=True))
    for n in range(60):
        step(twin, rng, tree)
        if n % 4 == 3:
            ask_everything(twin, rng, tree)
    ask_everything(twin, rng, tree)


def test_hand_computed_answers_on_both(twin: Twin) -> None:
    prompt = list(range(10 * CHUNK + 2))
    keys = keys_of(TOY, prompt, "", "")
    twin.report(batch("e0", reset=True, stored={"cpu": keys[:3], "file": keys[3:6]}))
    twin.report(batch("e1", reset=True, stored={"cpu": keys[:2], "redis": keys[:8]}))
    twin.report(batch("e2", reset=True, stored={"cpu": keys[1:5]}))  # no first chunk
    answer = twin.same_lookup(model="toy", tokens=prompt)
    matched = {n: m["matched_tokens"] for n, m in answer["instances"].items()}  # type: ignore[index]
    # e0: cpu then file (a union of disjoint stretches), then the shared redis store to 8.
    assert matched == {"e0": 8 * CHUNK, "e1": 8 * CHUNK, "e2": 0}
    assert answer["instances"]["e0"]["tiers"] == {"cpu": 12, "file": 0, "redis": 32}  # type: ignore[index]
    assert answer["shared"] == {SHARED.location: 32, SHARED_2.location: 0}
    assert twin.same_locate(keys[:3], "e1") == [["e0@10.0.0.1:8400"]] * 3  # e2 lends nothing
    twin.report(batch("e0", removed={"cpu": [keys[1]]}))
    assert twin.same_locate(keys[:3], "") == [
        ["e0@10.0.0.1:8400", "e1@10.0.0.2:8400"],
        ["e1@10.0.0.2:8400"],
        ["e0@10.0.0.1:8400"],
    ]


@pytest.fixture
def quick_twin(redis_server: RedisServer) -> Iterator[Twin]:
    """Both backends forgetting an engine silent for 1 s."""
    server = IndexServerThread(IndexServiceConfig(port=free_port(), instance_ttl_s=1.0)).start()
    url = valkey_index_url(redis_server, instance_ttl_s=1, maintain_s=0.2)
    clients = {"service": open_index(server.url), "valkey": open_index(url)}
    yield Twin(clients)
    for client in clients.values():
        client.close()
    server.stop()


def test_silent_engines_expire_alike_with_their_shared_stores(quick_twin: Twin) -> None:
    prompt = list(range(4 * CHUNK))
    keys = keys_of(TOY, prompt, "", "")
    quick_twin.report(batch("e0", reset=True, stored={"cpu": keys}))
    quick_twin.report(batch("e1", reset=True, stored={"cpu": keys[:2], "s3": keys}))
    assert quick_twin.same_lookup(model="toy", tokens=prompt)["shared"][SHARED_2.location] == 16  # type: ignore[index]
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:  # e0 keeps reporting, e1 went quiet
        quick_twin.report(batch("e0"))
        time.sleep(0.2)
    answer = quick_twin.same_lookup(model="toy", tokens=prompt)
    assert set(answer["instances"]) == {"e0"}  # type: ignore[arg-type]
    assert quick_twin.same_locate(keys, "") == [["e0@10.0.0.1:8400"]] * 4
    # e1's s3 store was forgotten with it: announced again, it starts empty on both.
    quick_twin.report(batch("e1", reset=True))
    assert quick_twin.same_lookup(model="toy", tokens=prompt)["shared"][SHARED_2.location] == 0  # type: ignore[index]
