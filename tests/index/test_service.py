"""The index service over real HTTP: engines announce through their KVCache, lookups agree with
each cache's own lookup, bad requests are answered 400 with the reason."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from kvstack.cluster.announcer import Announcer
from kvstack.cluster.config import AnnounceConfig
from kvstack.index.client import IndexClient, lookup_request
from kvstack.index.runner import IndexServerThread
from kvstack.kv import KVCache

CHUNK = 4


def kv(num_tokens: int) -> torch.Tensor:
    return torch.randn(2, 2, num_tokens, 2, 8).to(torch.float16)


@contextmanager
def engine(url: str, name: str, tiers: list[str]) -> Iterator[tuple[KVCache, Announcer]]:
    cache = KVCache.from_config({"model": "toy@1", "chunk_size": CHUNK, "tiers": tiers})
    config = AnnounceConfig(
        index_url=url, instance_id=name, served_model_names=["toy"], interval_s=0.02,
        heartbeat_s=0.2, peer_address=f"127.0.0.1:{hash(name) % 1000 + 9000}",
    )  # fmt: skip
    announcer = Announcer(cache, config).start()
    try:
        yield cache, announcer
    finally:
        announcer.close()
        cache.close()


def wait_for(check: object, timeout_s: float = 10.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_lookup_matches_each_engines_cache(index_server: IndexServerThread, tmp_path: Path) -> None:
    client = IndexClient(index_server.url)
    shared_prefix = list(range(100, 116))
    prompt_a = shared_prefix + list(range(16))
    prompt_b = shared_prefix + list(range(500, 508))
    with (
        engine(index_server.url, "a", ["cpu://?size=1MiB", f"file://{tmp_path}/a?size=1MiB"]) as (
            cache_a,
            _,
        ),
        engine(index_server.url, "b", ["cpu://?size=1MiB"]) as (cache_b, _),
    ):
        cache_a.store(prompt_a, kv(32), salt="tenant")
        cache_a.flush()
        cache_b.store(prompt_b, kv(24), salt="tenant")
        question = [*prompt_a, 7, 7, 7]

        def answered() -> bool:
            reply = client.lookup(lookup_request("toy", question, salt="tenant"))
            return {k: v.matched_tokens for k, v in reply.instances.items()} == {"a": 32, "b": 16}

        wait_for(answered)
        reply = client.lookup(lookup_request("toy", question, salt="tenant"))
        assert reply.instances["a"].tiers == {"cpu": 32, "file": 32}
        assert reply.instances["a"].matched_tokens == cache_a.lookup(question, salt="tenant")
        assert reply.instances["b"].matched_tokens == cache_b.lookup(question, salt="tenant")
        assert reply.instances["b"].peer.startswith("127.0.0.1:")
        other_salt = client.lookup(lookup_request("toy", question, salt="other"))
        assert {v.matched_tokens for v in other_salt.instances.values()} == {0}
        by_fingerprint = client.lookup(lookup_request("toy@1", question, salt="tenant"))
        assert by_fingerprint.instances["a"].matched_tokens == 32
        keys = cache_a.chunk_keys(question, salt="tenant")
        by_hash = client.lookup(lookup_request("", chunk_hashes=keys))
        assert by_hash.instances["a"].matched_chunks == 8
        located = client.locate(keys[:5], exclude="b")
        assert located.peers == ["a"] and located.holders == [[0]] * 5

        json_reply = httpx.post(
            f"{index_server.url}/lookup",
            json={"model": "toy", "tokens": question, "salt": "tenant"},
        ).json()
        assert json_reply["instances"]["a"]["matched_tokens"] == 32

        cache_a.tiers[0].remove(keys[0])  # removals reach the index too
        wait_for(
            lambda: (
                client.lookup(lookup_request("toy", question, salt="tenant"))
                .instances["a"]
                .tiers["cpu"]
                == 0
            )
        )
    client.close()


def test_index_restart_triggers_a_full_resync(index_server: IndexServerThread) -> None:
    client = IndexClient(index_server.url)
    prompt = list(range(40))
    with engine(index_server.url, "a", ["cpu://?size=1MiB"]) as (cache, announcer):
        cache.store(prompt, kv(40))
        wait_for(lambda: _matched(client, prompt).get("a") == 40)
        index_server.stop()
        cache.store(prompt[:8] + [1] * 8, kv(16))  # happens while the index is down
        restarted = IndexServerThread(index_server.config).start()  # new epoch, empty
        try:
            wait_for(lambda: _matched(client, prompt).get("a") == 40)
            assert _matched(client, prompt[:8] + [1] * 8).get("a") == 16
            assert announcer.full_syncs >= 2
        finally:
            restarted.stop()
    client.close()


def test_silent_engines_are_forgotten(tmp_path: Path) -> None:
    from kvstack.index.config import IndexServiceConfig
    from kvstack.stack.ports import free_port

    server = IndexServerThread(IndexServiceConfig(port=free_port(), instance_ttl_s=1.0)).start()
    client = IndexClient(server.url)
    try:
        with engine(server.url, "a", ["cpu://?size=1MiB"]) as (cache, _):
            cache.store(list(range(8)), kv(8))
            wait_for(lambda: _matched(client, list(range(8))).get("a") == 8)
        wait_for(lambda: "a" not in _matched(client, list(range(8))), timeout_s=5)
        assert httpx.get(f"{server.url}/instances").json()["instances"] == []
    finally:
        client.close()
        server.stop()


def _matched(client: IndexClient, tokens: list[int]) -> dict[str, int]:
    reply = client.lookup(lookup_request("toy", tokens))
    return {name: match.matched_tokens for name, match in reply.instances.items()}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"model": "toy", "chunk_hashes": ["zz"]}, "not hex"),
        ({"model": "toy", "chunk_hashes": ["00ff"]}, "16 bytes"),
        ({"model": "toy", "tokens": [1, "x"]}, "Expected `int`"),
        ({"model": "toy", "tokens": [-1]}, "out of range"),
        ({"model": "toy", "colour": "red"}, "unknown field"),
        ({"model": "toy", "tokens_u32": "AAA="}, "multiple of 4"),
    ],
)
def test_bad_lookups_are_400_with_the_reason(
    index_server: IndexServerThread, body: dict[str, object], problem: str
) -> None:
    with engine(index_server.url, "a", ["cpu://?size=1MiB"]) as (_, announcer):
        assert announcer.flush()
        response = httpx.post(f"{index_server.url}/lookup", content=json.dumps(body))
        assert response.status_code == 400
        assert problem in response.json()["error"]


def test_index_server_command(tmp_path: Path) -> None:
    from kvstack.stack.ports import free_port
    from kvstack.stack.procs import ManagedProcess

    port = free_port()
    argv = [sys.executable, "-m", "kvstack", "index-server", "--port", str(port)]
    with ManagedProcess("index", argv, tmp_path / "index.log") as proc:
        proc.wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=30)
        assert "kvstack_index_requests_total" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    bad = ManagedProcess("index", [*argv[:4], "--port", "70000"], tmp_path / "bad.log").start()
    assert bad.proc is not None and bad.proc.wait(timeout=30) == 2
    assert "index.service.port" in (tmp_path / "bad.log").read_text()


async def test_async_client_for_routers(index_server: IndexServerThread) -> None:
    from kvstack.index.client import AsyncIndexClient

    with engine(index_server.url, "a", ["cpu://?size=1MiB"]) as (cache, announcer):
        cache.store(list(range(16)), kv(16), adapter="ad1@v1")
        assert announcer.flush()
        client = AsyncIndexClient(index_server.url)
        try:
            reply = await client.lookup(lookup_request("toy", list(range(20)), adapter="ad1@v1"))
            assert reply.instances["a"].matched_tokens == 16
            base = await client.lookup(lookup_request("toy", list(range(20))))
            assert base.instances["a"].matched_tokens == 0  # adapters never share chunks
        finally:
            await client.aclose()
