"""The index service with the cluster secret, over real sockets (HTTP and ZMQ): only members are
answered, a report speaks only for its own instance (the spoofed reset that redirected /locate
to the prober's address is refused), and sizes are bounded with a clear refusal."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from kvstack.errors import ConfigError, IndexServiceError
from kvstack.index.auth import announce_token, bearer_header, sign_frames
from kvstack.index.client import IndexClient, lookup_request
from kvstack.index.config import IndexServiceConfig
from kvstack.index.protocol import AnnounceBatch, KeyProfile, LocateRequest
from kvstack.index.runner import IndexServerThread
from kvstack.security import ClusterKeys, SecurityConfig
from kvstack.stack.ports import free_port

KEYS = ClusterKeys(b"k" * 32)
OTHER = ClusterKeys(b"o" * 32)
PROFILE = KeyProfile(model="toy", chunk_size=16)
CHUNK = b"\x07" * 16


@pytest.fixture
def index() -> Iterator[IndexServerThread]:
    config = IndexServiceConfig(
        port=free_port(), zmq_port=free_port(), max_body_bytes=1 << 20, max_report_keys=64,
        max_instances=3,
    )  # fmt: skip
    server = IndexServerThread(config, KEYS).start()
    yield server
    server.stop()


def report(instance: str, peer: str, keys: ClusterKeys | None = KEYS) -> Any:
    token = "" if keys is None else announce_token(keys, instance)
    return AnnounceBatch(instance=instance, profile=PROFILE, peer=peer, token=token, reset=True,
                         stored={"cpu": [CHUNK]})  # fmt: skip


def test_only_members_are_answered_over_http(index: IndexServerThread) -> None:
    with httpx.Client(base_url=index.url, timeout=5) as http:
        assert http.get("/health").status_code == 200  # the one open route
        for method, path in (("GET", "/instances"), ("GET", "/metrics"), ("POST", "/lookup"),
                             ("POST", "/locate"), ("POST", "/events")):  # fmt: skip
            answer = http.request(method, path, content=b"{}")
            assert answer.status_code == 401, path
            assert "bearer token" in answer.json()["error"]
        wrong = {"authorization": bearer_header(OTHER)}
        assert http.get("/instances", headers=wrong).status_code == 401
        right = {"authorization": bearer_header(KEYS)}
        assert http.get("/instances", headers=right).status_code == 200
        metrics = http.get("/metrics", headers=right).text
        assert 'kvstack_index_refused_total{reason="auth"}' in metrics


def test_a_spoofed_reset_cannot_redirect_locate(index: IndexServerThread) -> None:
    """The finding: a reset under another engine's id replaced its peer address and /locate
    then answered the prober's 127.0.0.1:6666. Now it is refused, with or without a leaked
    bearer token, and /locate keeps answering the real engine."""
    engine = IndexClient(index.url, keys=KEYS)
    engine.report(report("engine-a", "10.0.0.7:8400"))
    spoof = msgspec.msgpack.encode(report("engine-a", "127.0.0.1:6666", keys=None))
    headers = {"content-type": "application/msgpack"}
    with httpx.Client(base_url=index.url, timeout=5, headers=headers) as prober:
        assert prober.post("/events", content=spoof).status_code == 401  # no credential at all
        leaked = {"authorization": bearer_header(KEYS)}  # the members' token, no identity
        answer = prober.post("/events", content=spoof, headers=leaked)
        assert answer.status_code == 403 and "announce token" in answer.json()["error"]
        minted = msgspec.msgpack.encode(report("engine-a", "127.0.0.1:6666", keys=OTHER))
        assert prober.post("/events", content=minted, headers=leaked).status_code == 403
    borrowed = report("engine-a", "127.0.0.1:6666", keys=KEYS)
    borrowed.token = announce_token(KEYS, "engine-b")  # engine b's own token
    with pytest.raises(IndexServiceError, match=r"403.*announce token") as refused:
        engine.report(borrowed)
    assert refused.value.status == "403"
    located = engine.locate([CHUNK])
    assert located.addresses == ["10.0.0.7:8400"] and located.holders == [[0]]
    engine.close()


def test_zmq_refuses_unsigned_forged_and_replayed_frames(index: IndexServerThread) -> None:
    assert index.zmq_url is not None
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(index.zmq_url.replace("zmq://", "tcp://"))
    body = msgspec.msgpack.encode(LocateRequest(keys=[CHUNK]))
    try:

        def ask(*frames: bytes) -> tuple[bytes, bytes]:
            sock.send_multipart(list(frames))
            _, status, answer = sock.recv_multipart()
            return status, answer

        status, answer = ask(b"1", b"locate", body)
        assert status == b"401" and b"unsigned request" in answer
        forged = sign_frames(OTHER, b"2", b"locate", body)
        status, answer = ask(b"2", b"locate", body, forged)
        assert status == b"401" and b"forged" in answer
        genuine = sign_frames(KEYS, b"3", b"locate", body)
        assert ask(b"3", b"locate", body, genuine)[0] == b"200"
        status, answer = ask(b"3", b"locate", body, genuine)  # the same frames again
        assert status == b"401" and b"replayed" in answer
        tampered = msgspec.msgpack.encode(LocateRequest(keys=[b"\x08" * 16]))
        status, _ = ask(b"4", b"locate", tampered, sign_frames(KEYS, b"4", b"locate", body))
        assert status == b"401"
    finally:
        sock.close()


def test_members_over_zmq_and_the_limits(index: IndexServerThread) -> None:
    assert index.zmq_url is not None
    client = IndexClient(index.zmq_url, keys=KEYS)
    stranger = IndexClient(index.zmq_url, keys=None, timeout_s=5)
    try:
        assert client.report(report("a", "10.0.0.1:1")).epoch
        assert client.lookup(lookup_request("toy", list(range(32)))).num_tokens == 32
        with pytest.raises(IndexServiceError, match="401"):
            stranger.lookup(lookup_request("toy", list(range(32))))
        too_many = report("a", "10.0.0.1:1")
        too_many.stored = {"cpu": [bytes([i]) * 16 for i in range(65)]}
        with pytest.raises(IndexServiceError, match="max_report_keys") as refused:
            client.report(too_many)
        assert refused.value.status == "413"
        with pytest.raises(IndexServiceError, match="16"):  # a key must be 16 bytes
            client.locate([b"\x01" * 17])
        for name in ("b", "c"):
            client.report(report(name, "10.0.0.1:1"))
        with pytest.raises(IndexServiceError, match="max_instances") as refused:
            client.report(report("d", "10.0.0.1:1"))
        assert refused.value.status == "429"
    finally:
        client.close()
        stranger.close()


def test_an_oversized_body_is_refused_before_it_is_read(index: IndexServerThread) -> None:
    right = {"authorization": bearer_header(KEYS), "content-type": "application/msgpack"}
    with httpx.Client(base_url=index.url, timeout=5, headers=right) as http:
        answer = http.post("/lookup", content=b"\x00" * ((1 << 20) + 1))
        assert answer.status_code == 413 and "max_body_bytes" in answer.json()["error"]


def test_without_a_secret_the_index_listens_on_loopback_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    public = IndexServiceConfig(host="0.0.0.0", port=free_port())
    with pytest.raises(ConfigError, match="without authentication"):
        IndexServerThread(public)
    with caplog.at_level(logging.WARNING, logger="kvstack.security"):
        IndexServerThread(public, security=SecurityConfig(insecure_no_auth=True))
    assert "WITHOUT authentication" in caplog.text
    IndexServerThread(public, KEYS)  # with the secret: any address


def test_an_oversized_zmq_message_is_dropped_and_the_server_keeps_serving(
    index: IndexServerThread,
) -> None:
    """libzmq refuses a message over max_body_bytes before allocating it (ZMQ_MAXMSGSIZE) and
    drops that connection; other clients are answered as before."""
    assert index.zmq_url is not None
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 1000)
    sock.connect(index.zmq_url.replace("zmq://", "tcp://"))
    body = b"\x00" * (2 << 20)
    try:
        sock.send_multipart([b"1", b"lookup", body, sign_frames(KEYS, b"1", b"lookup", body)])
        with pytest.raises(zmq.Again):
            sock.recv_multipart()  # no answer: the message never reached the index
    finally:
        sock.close()
    client = IndexClient(index.zmq_url, keys=KEYS)
    assert client.lookup(lookup_request("toy", list(range(16)))).num_tokens == 16
    client.close()
