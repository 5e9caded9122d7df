"""A Valkey lookup writes each segment's ``MGET`` as soon as its keys are hashed, on one pooled
connection (:mod:`kvstack.index.valkey.reads`, ``drive_ahead`` in :mod:`.connect`). Against a
real redis-server, blocking and async: a prompt of many segments gets the in-memory index's
answer at every segment size; a dropped connection is retried; and a lookup that fails half way
(an error reply, a timeout) leaves none of its replies for the next lookup on that connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvstack.errors import ConfigError, IndexServiceError, IndexTimeoutError
from kvstack.index.client import lookup_request
from kvstack.index.protocol import AnnounceBatch, KeyProfile, TierInfo
from kvstack.index.state import IndexState
from kvstack.index.valkey.client import AsyncValkeyIndex, ValkeyIndex
from kvstack.index.valkey.url import parse_valkey_url
from kvstack.kv.keys import Namespace, chunk_keys
from tests.index.conftest import valkey_index_url
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = pytest.mark.redis

CHUNK = 4
PROFILE = KeyProfile(model="toy@1", chunk_size=CHUNK)
PROMPT = list(range(1000, 1000 + 400 * CHUNK))  # 400 chunks: 4 segments of the default 128
KEYS = chunk_keys(PROMPT, Namespace("toy@1"), CHUNK)
SHARED = TierInfo("redis", shared=True, location="redis://store:6379/0/kv:")
BATCHES = [
    AnnounceBatch(instance="e0", profile=PROFILE, aliases=["toy"], reset=True,
                  tiers=[TierInfo("cpu"), TierInfo("file"), SHARED],
                  stored={"cpu": KEYS[:130], "file": KEYS[:300], "redis": KEYS[:257]}),
    AnnounceBatch(instance="e1", profile=PROFILE, aliases=["toy"], reset=True,
                  tiers=[TierInfo("cpu")], stored={"cpu": KEYS}),
]  # fmt: skip
REQUEST = lookup_request("toy", PROMPT)


def expected() -> dict[str, Any]:
    state = IndexState()
    for batch in BATCHES:
        state.apply(batch)
    answer: dict[str, Any] = msgspec.to_builtins(state.lookup(REQUEST))
    matched = {name: m["matched_tokens"] for name, m in answer["instances"].items()}
    assert matched == {"e0": 300 * CHUNK, "e1": 400 * CHUNK}  # segments 1-3 decide e0
    assert answer["shared"] == {SHARED.location: 257 * CHUNK}
    return answer


def fed(url: str, timeout_s: float = 2.0) -> ValkeyIndex:
    client = ValkeyIndex(url, timeout_s)
    for batch in BATCHES:
        assert not client.report(batch).resync
    return client


def answer(reply: Any) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(reply)
    return result


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (the tests pause and break it)."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def test_every_segment_size_gives_the_one_trip_answer(redis_server: RedisServer) -> None:
    want = expected()
    url = valkey_index_url(redis_server)
    fed(url).close()
    for ahead in (0, 1, 7, 128, 1000):  # 0: one pipelined trip; 1000: more than the prompt
        client = ValkeyIndex(f"{url}&send_ahead={ahead}")
        try:
            assert client.options.send_ahead == ahead
            assert answer(client.lookup(REQUEST)) == want, ahead
        finally:
            client.close()


def test_a_dropped_connection_is_asked_again(own_redis: RedisServer) -> None:
    want = expected()
    client = fed(valkey_index_url(own_redis))
    try:
        assert answer(client.lookup(REQUEST)) == want
        assert int(own_redis.cli("CLIENT", "KILL", "TYPE", "normal").strip() or 0) >= 1
        assert answer(client.lookup(REQUEST)) == want  # its pooled connection was dead
    finally:
        client.close()


def _break_state(server: RedisServer, url: str) -> tuple[str, str]:
    """Make the registry version key a hash, so the lookup's first reply is an error (its
    MGETs' replies are still on the wire); the key and its value, to put back."""
    prefix = url.split("prefix=")[1].split("&")[0]
    key = f"{{{prefix}r}}V"
    value = server.cli("GET", key).strip()
    server.cli("DEL", key)
    server.cli("HSET", key, "not", "a version")
    return key, value


def test_a_failed_lookup_leaves_nothing_on_its_connection(own_redis: RedisServer) -> None:
    want = expected()
    url = valkey_index_url(own_redis)
    client = fed(url, timeout_s=0.5)
    try:
        assert answer(client.lookup(REQUEST)) == want
        key, value = _break_state(own_redis, url)
        with pytest.raises(IndexServiceError, match="WRONGTYPE"):
            client.lookup(REQUEST)
        own_redis.cli("DEL", key)
        own_redis.cli("SET", key, value)
        assert answer(client.lookup(REQUEST)) == want
        assert len(client.locate(KEYS[:5]).holders) == 5
        own_redis.pause()  # the request is written; its replies come after the timeout
        try:
            with pytest.raises(IndexTimeoutError):
                client.lookup(REQUEST)
        finally:
            own_redis.resume()
        assert answer(client.lookup(REQUEST)) == want  # not the late replies
    finally:
        client.close()


def test_the_async_client_alike(own_redis: RedisServer) -> None:
    want = expected()
    url = valkey_index_url(own_redis)
    fed(url).close()

    async def scenario() -> None:
        client = AsyncValkeyIndex(url, timeout_s=0.5)
        try:
            assert answer(await client.lookup(REQUEST)) == want
            assert int(own_redis.cli("CLIENT", "KILL", "TYPE", "normal").strip() or 0) >= 1
            assert answer(await client.lookup(REQUEST)) == want
            key, value = _break_state(own_redis, url)
            with pytest.raises(IndexServiceError, match="WRONGTYPE"):
                await client.lookup(REQUEST)
            own_redis.cli("DEL", key)
            own_redis.cli("SET", key, value)
            assert answer(await client.lookup(REQUEST)) == want
            own_redis.pause()
            try:
                with pytest.raises(IndexTimeoutError):
                    await client.lookup(REQUEST)
            finally:
                own_redis.resume()
            both = await asyncio.gather(client.lookup(REQUEST), client.lookup(REQUEST))
            assert [answer(r) for r in both] == [want, want]  # two connections at once
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_send_ahead_is_a_url_setting_a_cluster_cannot_use() -> None:
    assert parse_valkey_url("redis://h:6379/0").send_ahead == 128
    assert parse_valkey_url("redis://h:6379/0?send_ahead=0").send_ahead == 0
    assert parse_valkey_url("redis://a:1,b:2/0?cluster=true").send_ahead == 0
    assert parse_valkey_url("redis://a:1,b:2/0?cluster=true&send_ahead=0").send_ahead == 0
    with pytest.raises(ConfigError, match="send_ahead works standalone and behind Sentinel"):
        parse_valkey_url("redis://a:1,b:2/0?cluster=true&send_ahead=64")
    with pytest.raises(ConfigError, match="send_ahead"):
        parse_valkey_url("redis://h:6379/0?send_ahead=-1")


def test_commands_are_packed_as_redis_py_packs_them() -> None:
    """The send-ahead driver packs with hiredis directly; the bytes on the wire must be what
    redis-py itself would have sent for the same commands (a lookup's and a locate's)."""
    import redis

    from kvstack.index.valkey import connect
    from kvstack.index.valkey.layout import KeyLayout
    from kvstack.index.valkey.reads import IndexReader

    assert connect.hiredis is not None  # the redis extra installs hiredis
    reader = IndexReader(KeyLayout("kv", 16), parse_valkey_url("redis://h:6379/0"))
    mgets, _ = reader.layout.mget_commands(KEYS)
    commands = [reader._state, reader._snapshot_command, *mgets, ("MGET", b"\x00\xff\r\n", 7)]
    conn = redis.Connection()
    ours = b"".join(connect._packed(conn, commands))
    assert ours == b"".join(conn.pack_commands(commands))
    assert ours.startswith(b"*5\r\n$4\r\nEVAL\r\n")
