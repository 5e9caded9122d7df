"""The index service over ZMQ, on real sockets: the same answers as over HTTP, invalid requests
answered with the reason while the server keeps serving, timeouts that leave the client usable
(late replies dropped), concurrent async lookups each matched to their own reply."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
import zmq
import zmq.asyncio
from prometheus_client import REGISTRY

from kvstack.cluster.config import AnnounceConfig
from kvstack.errors import ConfigError, IndexServiceError, IndexTimeoutError
from kvstack.index.client import AsyncIndexClient, IndexClient, lookup_request
from kvstack.index.config import IndexServiceConfig
from kvstack.index.operations import Operation
from kvstack.index.protocol import AnnounceBatch, KeyProfile, LookupReply, LookupRequest, TierInfo
from kvstack.index.runner import IndexServerThread
from kvstack.index.zmq_server import ZmqServer
from kvstack.kv.keys import Namespace, chunk_keys
from kvstack.router.scheduling.config import PrefixConfig
from kvstack.stack.ports import free_port

CHUNK = 4
TOKENS = list(range(100, 100 + 8 * CHUNK))  # 8 chunks
KEYS = chunk_keys(TOKENS, Namespace("toy@1"), CHUNK)
PROFILE = KeyProfile(model="toy@1", chunk_size=CHUNK)
TIERS = [TierInfo("cpu"), TierInfo("redis", shared=True, location="redis://r:6379/0/kv:")]
encode = msgspec.msgpack.encode


@pytest.fixture
def server() -> Iterator[IndexServerThread]:
    config = IndexServiceConfig(port=free_port(), zmq_port=free_port())
    server = IndexServerThread(config).start()
    yield server
    server.stop()


@pytest.fixture
def zmq_url(server: IndexServerThread) -> str:
    """The server's ZMQ URL, engine "a" holding all of TOKENS in its CPU tier."""
    assert server.zmq_url is not None
    client = IndexClient(server.zmq_url)
    report(client, "a", {"cpu": KEYS})
    client.close()
    return server.zmq_url


def report(client: IndexClient, instance: str, stored: dict[str, list[bytes]]) -> None:
    batch = AnnounceBatch(
        instance, PROFILE, aliases=["toy"], peer=f"{instance}:8400", tiers=TIERS, reset=True,
        stored=stored,
    )  # fmt: skip
    assert not client.report(batch).resync


def requests_counted(route: str, status: str) -> float:
    labels = {"route": route, "status": status}
    return REGISTRY.get_sample_value("kvstack_index_requests_total", labels) or 0.0


def test_zmq_answers_as_http(server: IndexServerThread, zmq_url: str) -> None:
    over_http, over_zmq = IndexClient(server.url), IndexClient(zmq_url)
    try:
        report(over_zmq, "a", {"cpu": KEYS[:6]})  # a reset: replaces what "a" held
        report(over_http, "b", {"cpu": KEYS[:2], "redis": KEYS[:3]})
        before = requests_counted("lookup", "200")
        questions = [
            lookup_request("toy", [*TOKENS, 1, 2]),
            lookup_request("toy@1", TOKENS[:10]),
            lookup_request("", chunk_hashes=KEYS),
        ]
        for question in questions:
            assert over_zmq.lookup(question) == over_http.lookup(question)
        reply = over_zmq.lookup(questions[0])
        assert {k: v.matched_tokens for k, v in reply.instances.items()} == {
            "a": 6 * CHUNK,
            "b": 3 * CHUNK,  # through the shared store
        }
        assert requests_counted("lookup", "200") == before + 2 * len(questions) + 1
        assert over_zmq.locate(KEYS[:4], exclude="b") == over_http.locate(KEYS[:4], exclude="b")
        located = over_zmq.locate(KEYS[:4], exclude="b")
        assert (located.peers, located.addresses, located.holders) == (["a"], ["a:8400"], [[0]] * 4)
        stale = AnnounceBatch("a", PROFILE, epoch="another-epoch")
        assert over_zmq.report(stale) == over_http.report(stale)
        assert over_zmq.report(stale).resync
    finally:
        over_http.close()
        over_zmq.close()


def test_an_engine_announces_over_zmq(server: IndexServerThread) -> None:
    from tests.index.test_service import engine, kv

    assert server.zmq_url is not None
    client = IndexClient(server.zmq_url)
    with engine(server.zmq_url, "z", ["cpu://?size=1MiB"]) as (cache, announcer):
        cache.store(list(range(16)), kv(16))
        assert announcer.flush()
        assert client.lookup(lookup_request("toy", list(range(20)))).instances["z"].tiers == {
            "cpu": 16
        }
    client.close()


def ask(sock: zmq.Socket[bytes], frames: list[bytes]) -> list[bytes]:
    sock.send_multipart(frames)
    assert sock.poll(10_000), "no reply"
    return sock.recv_multipart()


@pytest.mark.parametrize(
    ("frames", "problem"),
    [
        ([b"1", b"frobnicate", b""], "unknown operation 'frobnicate'; expected one of events"),
        ([b"1", b"lookup", b"\xc1"], "invalid lookup request: MessagePack data is malformed"),
        ([b"1", b"lookup", encode({"model": "toy", "colour": "red"})], "unknown field"),
        ([b"1", b"lookup", encode({"model": "toy", "chunk_hashes": ["zz"]})], "not hex"),
        ([b"1", b"lookup", encode({"model": "toy", "tokens_u32": b"abc"})], "multiple of 4"),
        ([b"1", b"locate", encode({"keys": "nope"})], "Expected `array`"),
        ([b"1", b"events", encode({"instance": "a"})], "missing required field `profile`"),
        ([b"1", b"lookup"], "expected 3 or 4 frames (request id, operation, body[, auth]), got 2"),
    ],
)
def test_invalid_requests_get_the_reason_and_the_server_keeps_serving(
    zmq_url: str, frames: list[bytes], problem: str
) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(zmq_url.replace("zmq://", "tcp://"))
    try:
        request_id, status, body = ask(sock, frames)
        assert (request_id, status) == (b"1", b"400")
        assert problem in msgspec.msgpack.decode(body)["error"]
        request_id, status, body = ask(sock, [b"2", b"lookup", encode(lookup_request("toy", [1]))])
        assert (request_id, status) == (b"2", b"200")
        assert msgspec.msgpack.decode(body, type=LookupReply).num_tokens == 1
    finally:
        sock.close()


async def test_a_failing_operation_is_answered_500_and_the_loop_goes_on() -> None:
    def fail(_: LookupRequest) -> LookupReply:
        raise RuntimeError("the index is on fire")

    operations = {"lookup": Operation(LookupRequest, fail), "echo": Operation(str, str.upper)}
    server = ZmqServer(operations, "127.0.0.1", free_port()).start()
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.endpoint)
    try:
        await sock.send_multipart([b"1", b"lookup", encode(LookupRequest(model="toy"))])
        request_id, status, body = await sock.recv_multipart()
        assert (request_id, status) == (b"1", b"500")
        assert "the index is on fire" in msgspec.msgpack.decode(body)["error"]
        await sock.send_multipart([b"2", b"echo", encode("still here")])
        assert await sock.recv_multipart() == [b"2", b"200", encode("STILL HERE")]
    finally:
        sock.close()
        await server.aclose()


def bad_lookup() -> LookupRequest:
    return LookupRequest(model="toy", chunk_hashes=["zz"])


def test_the_client_raises_the_servers_reason(zmq_url: str) -> None:
    client = IndexClient(zmq_url)
    try:
        with pytest.raises(IndexServiceError, match=r"answered 400: .*not hex") as refused:
            client.lookup(bad_lookup())
        assert refused.value.status == "400"
        assert client.lookup(lookup_request("toy", [1, 2])).num_tokens == 2
    finally:
        client.close()


def test_a_timeout_leaves_the_blocking_client_usable() -> None:
    port = free_port()
    client = IndexClient(f"zmq://127.0.0.1:{port}", timeout_s=1.0)
    silent = zmq.Context.instance().socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    try:
        with pytest.raises(IndexTimeoutError, match="did not answer lookup within 1 s"):
            client.lookup(lookup_request("toy", [1]))  # nothing listens yet
        silent.bind(f"tcp://127.0.0.1:{port}")
        with pytest.raises(TimeoutError):  # a server that does not answer
            client.lookup(lookup_request("toy", [1]))
        assert silent.poll(10_000), "the request never arrived"
        identity, late_id, *_ = silent.recv_multipart()

        def answer_late_then_on_time() -> None:
            if not silent.poll(10_000):
                return
            _, request_id, *_ = silent.recv_multipart()
            silent.send_multipart([identity, late_id, b"200", encode(LookupReply(111, {}, {}))])
            silent.send_multipart([identity, request_id, b"200", encode(LookupReply(2, {}, {}))])

        thread = threading.Thread(target=answer_late_then_on_time, daemon=True)
        thread.start()
        assert client.lookup(lookup_request("toy", [1, 2])).num_tokens == 2  # not the late 111
        thread.join()
    finally:
        client.close()
        silent.close()


async def test_a_timeout_leaves_the_async_client_usable() -> None:
    port = free_port()
    silent = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"tcp://127.0.0.1:{port}")
    client = AsyncIndexClient(f"zmq://127.0.0.1:{port}", timeout_s=1.0)
    try:
        with pytest.raises(IndexTimeoutError, match="did not answer lookup"):
            await client.lookup(lookup_request("toy", [1]))
        identity, late_id, *_ = await silent.recv_multipart()
        pending = asyncio.create_task(client.lookup(lookup_request("toy", [1, 2])))
        _, request_id, *_ = await silent.recv_multipart()
        await silent.send_multipart([identity, late_id, b"200", encode(LookupReply(111, {}, {}))])
        await silent.send_multipart([identity, request_id, b"200", encode(LookupReply(2, {}, {}))])
        assert (await pending).num_tokens == 2
    finally:
        await client.aclose()
        silent.close()


async def test_concurrent_async_lookups_each_get_their_own_answer(zmq_url: str) -> None:
    client = AsyncIndexClient(zmq_url, timeout_s=10.0)
    try:
        lengths = [n * CHUNK + extra for n in range(8) for extra in (0, 1, 3)] + [len(TOKENS)]
        replies = await asyncio.gather(
            *(client.lookup(lookup_request("toy", TOKENS[:n])) for n in lengths),
            client.lookup(bad_lookup()),
            return_exceptions=True,
        )
        *answers, refused = replies
        assert isinstance(refused, IndexServiceError) and "not hex" in str(refused)
        for n, reply in zip(lengths, answers, strict=True):
            assert isinstance(reply, LookupReply)
            assert reply.num_tokens == n
            assert reply.instances["a"].matched_tokens == n // CHUNK * CHUNK
    finally:
        await client.aclose()


def test_index_server_command_with_zmq_port(tmp_path: Path) -> None:
    from kvstack.stack.procs import ManagedProcess

    port, zmq_port = free_port(), free_port()
    argv = [sys.executable, "-m", "kvstack", "index-server", "--port", str(port),
            "--zmq-port", str(zmq_port)]  # fmt: skip
    with ManagedProcess("index", argv, tmp_path / "index.log") as proc:
        proc.wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=30)
        client = IndexClient(f"zmq://127.0.0.1:{zmq_port}", timeout_s=10.0)
        try:
            assert client.lookup(lookup_request("toy", [1, 2, 3])).num_tokens == 3
        finally:
            client.close()
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'kvstack_index_requests_total{route="lookup",status="200"} 1.0' in metrics


@pytest.mark.parametrize(
    "url", ["zmq://index", "zmq://index:port", "zmq://index:8301/x", "ftp://a"]
)
def test_index_urls_are_checked(url: str) -> None:
    with pytest.raises(ConfigError, match="index"):
        IndexClient(url)
    with pytest.raises(ValueError, match="index"):
        AnnounceConfig(index_url=url)
    with pytest.raises(ValueError, match="index"):
        PrefixConfig(index_url=url)
    assert PrefixConfig(index_url="zmq://index:8301").index_url == "zmq://index:8301"


def test_the_zmq_port_is_not_the_http_port() -> None:
    with pytest.raises(ValueError, match="zmq_port must differ from port"):
        IndexServiceConfig(port=8300, zmq_port=8300)
