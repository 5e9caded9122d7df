"""The peer server with the cluster secret and its bounds, over real loopback TCP: only members
get an answer, a slowloris client is cut off within its deadline while others are served, a
client that never reads its GET answer loses its stream and its CPU-tier leases, connections
are capped, and a hostile peer's chunks (another secret's MAC, a forged header) never reach the
caller."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from prometheus_client import REGISTRY

from kvstack.cluster.config import PeerServerConfig
from kvstack.cluster.peer_server import PeerServer
from kvstack.errors import ConfigError
from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys
from kvstack.kv.seal import ChunkSealer
from kvstack.kv.tiers.cpu.tier import CPUTier
from kvstack.kv.tiers.peer import protocol
from kvstack.kv.tiers.peer.client import PeerClient
from kvstack.kv.tiers.peer.tier import PeerTier
from kvstack.kv.tiers.remote import codec
from kvstack.kv.trust import ChunkTrust
from kvstack.security import ClusterKeys, SecurityConfig

KEYS, OTHER = ClusterKeys(b"k" * 32), ClusterKeys(b"o" * 32)


def keys(n: int) -> list[ChunkKey]:
    return chunk_keys(list(range(n)), Namespace("peer-security"), 1)


def trust(k: ClusterKeys | None) -> ChunkTrust:
    return ChunkTrust(None if k is None else ChunkSealer(k))


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def lender() -> Iterator[tuple[CPUTier, PeerServer]]:
    tier = CPUTier(64 << 20)
    config = PeerServerConfig(host="127.0.0.1", port=0, timeout_s=1.0, max_connections_per_peer=8)
    server = PeerServer([tier], config, keys=KEYS)
    server.start_background()
    yield tier, server
    server.stop()
    tier.close()


def test_only_members_get_an_answer(lender: tuple[CPUTier, PeerServer]) -> None:
    tier, server = lender
    ks = keys(2)
    tier.put(ks[0], torch.ones(4, 4))
    address = f"127.0.0.1:{server.port}"
    auth_refusals = _refusals("auth")
    with pytest.raises(protocol.ProtocolError, match="requires the cluster secret"):
        PeerClient(address, trust=trust(None)).lookup(ks)
    with pytest.raises(protocol.ProtocolError, match="refused this engine's credentials"):
        PeerClient(address, trust=trust(OTHER)).lookup(ks)
    assert _refusals("auth") >= auth_refusals + 1  # the stranger's wrong proof, counted
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        hello = protocol.parse_hello(raw.recv(protocol.HELLO.size, socket.MSG_WAITALL))
        assert hello.auth == protocol.AUTH_CHALLENGE
        raw.sendall(protocol.pack_request(protocol.LOOKUP, ks))  # no handshake: straight in
        answer = raw.recv(4096)
        assert not answer.startswith(protocol.ANSWER_MAGIC)  # never a LOOKUP answer
    member = PeerClient(address, trust=trust(KEYS))
    assert member.lookup(ks) == [True, False]
    member.close()


def test_rotation_mixed_members_talk_while_both_secrets_are_accepted() -> None:
    """Step 1 gave everyone the new secret as ``previous``; step 2 swaps them one by one: a
    server already on the new secret and a client still on the old one both accept both."""
    old, new = b"k" * 32, b"n" * 32
    tier = CPUTier(1 << 20)
    server = PeerServer([tier], PeerServerConfig(host="127.0.0.1", port=0), ClusterKeys(new, old))
    server.start_background()
    address = f"127.0.0.1:{server.port}"
    try:
        assert PeerClient(address, trust=trust(ClusterKeys(old, new))).lookup(keys(1)) == [False]
        with pytest.raises(protocol.ProtocolError, match="failed to prove"):
            PeerClient(address, trust=trust(ClusterKeys(old))).lookup(keys(1))  # skipped step 1
    finally:
        server.stop()
        tier.close()


def test_a_slowloris_client_is_cut_off_while_others_are_served(
    lender: tuple[CPUTier, PeerServer],
) -> None:
    """The finding: a header announcing 4,096 keys, then nothing, held its connection past
    3.5 s with timeout_s=1, and 200 of them were all held."""
    tier, server = lender
    ks = keys(1)
    tier.put(ks[0], torch.ones(4, 4))
    slow = [_authenticated_socket(server.port) for _ in range(6)]
    for s in slow:
        s.sendall(protocol.REQUEST.pack(protocol.REQUEST_MAGIC, protocol.LOOKUP, 0, 0, 4096))
    started = time.monotonic()
    member = PeerClient(f"127.0.0.1:{server.port}", trust=trust(KEYS))
    assert member.lookup(ks) == [True]  # served while the slow ones hang
    for s in slow:
        s.settimeout(5)
        assert s.recv(1) == b""  # closed by the server
    cut_after_s = time.monotonic() - started
    assert cut_after_s < 3.0, f"slow clients held for {cut_after_s:.1f} s with timeout_s=1"
    wait_for(lambda: server.num_connections <= 1)
    member.close()


def _authenticated_socket(port: int) -> socket.socket:
    """A raw connection past the handshake (a member that then misbehaves)."""
    import os

    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    hello = protocol.parse_hello(s.recv(protocol.HELLO.size, socket.MSG_WAITALL))
    nonce = os.urandom(protocol.NONCE_BYTES)
    proof = protocol.prove(KEYS, b"client", hello.nonce, nonce)
    s.sendall(protocol.AUTH.pack(protocol.AUTH_MAGIC, nonce, proof))
    assert protocol.WELCOME.unpack(s.recv(protocol.WELCOME.size, socket.MSG_WAITALL))[1] == 0
    return s


def test_an_abandoned_get_frees_its_stream_and_leases(lender: tuple[CPUTier, PeerServer]) -> None:
    tier, server = lender
    ks = keys(6)
    for key in ks:
        tier.put(key, torch.ones(1 << 20))  # 4 MiB each: far more than socket buffers hold
    s = _authenticated_socket(server.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(protocol.pack_request(protocol.GET, ks))  # ... and never read the answer
    wait_for(lambda: server.num_streams == 1, 5)
    # the stream borrows each chunk as it writes it: held while it blocks on the full socket
    wait_for(lambda: tier.stats().extra["leased_entries"] >= 1, 5)
    wait_for(lambda: server.num_streams == 0, 5)  # cut off at the write deadline
    wait_for(lambda: tier.stats().extra["leased_entries"] == 0, 5)
    s.close()


def test_connections_are_capped_per_peer_with_a_reason() -> None:
    tier = CPUTier(1 << 20)
    config = PeerServerConfig(host="127.0.0.1", port=0, max_connections_per_peer=2)
    server = PeerServer([tier], config)
    server.start_background()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(2)]
    try:
        for s in held:
            assert protocol.parse_hello(s.recv(protocol.HELLO.size, socket.MSG_WAITALL)).status == 0
        with pytest.raises(protocol.ProtocolError, match="max_connections_per_peer"):
            PeerClient(f"127.0.0.1:{server.port}").lookup(keys(1))
    finally:
        for s in held:
            s.close()
        server.stop()
        tier.close()


def _refusals(reason: str) -> float:
    return REGISTRY.get_sample_value("kvstack_peer_refused_total", {"reason": reason}) or 0.0


def test_connections_are_capped_in_total_and_each_refusal_is_counted() -> None:
    """Clients from one address are many peers to a NAT'ed fleet: the total cap holds whatever
    the per-peer cap allows, the refusal names the setting and goes to the counter."""
    tier = CPUTier(1 << 20)
    config = PeerServerConfig(
        host="127.0.0.1", port=0, max_connections=3, max_connections_per_peer=10
    )
    server = PeerServer([tier], config)
    server.start_background()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
    before = _refusals("connections")
    try:
        for s in held:
            assert protocol.parse_hello(s.recv(protocol.HELLO.size, socket.MSG_WAITALL)).status == 0
        with pytest.raises(protocol.ProtocolError, match=r"max_connections\)"):
            PeerClient(f"127.0.0.1:{server.port}").lookup(keys(1))
        assert _refusals("connections") == before + 1
        held.pop().close()  # a slot frees: the next client is served again
        deadline = time.monotonic() + 5
        while True:
            try:
                assert PeerClient(f"127.0.0.1:{server.port}").lookup(keys(1)) is not None
                break
            except protocol.ProtocolError:
                assert time.monotonic() < deadline, "the freed slot was never reused"
                time.sleep(0.05)
    finally:
        for s in held:
            s.close()
        server.stop()
        tier.close()


def test_without_a_secret_the_peer_server_binds_loopback_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    public = PeerServerConfig(host="0.0.0.0", port=0)
    with pytest.raises(ConfigError, match="without authentication"):
        PeerServer([], public).bind()
    with caplog.at_level(logging.WARNING, logger="kvstack.security"):
        PeerServer([], public, security=SecurityConfig(insecure_no_auth=True)).bind()
    assert "WITHOUT authentication" in caplog.text
    assert PeerServerConfig().host == "127.0.0.1"


class HostilePeer:
    """A real peer server socket that passes the handshake (it holds the secret, or none) and
    answers every GET with the chunk bytes it is given."""

    def __init__(self, keys: ClusterKeys | None, answer: Callable[[ChunkKey], bytes]) -> None:
        self.keys, self.answer = keys, answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import os

        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                nonce = os.urandom(16)
                auth = protocol.AUTH_NONE if self.keys is None else protocol.AUTH_CHALLENGE
                conn.sendall(protocol.pack_hello(protocol.OK, auth, nonce))
                if self.keys is not None:
                    _, client_nonce, _ = protocol.AUTH.unpack(
                        conn.recv(protocol.AUTH.size, socket.MSG_WAITALL)
                    )
                    proof = protocol.prove(self.keys, b"server", nonce, client_nonce)
                    conn.sendall(protocol.WELCOME.pack(protocol.WELCOME_MAGIC, 0, 0, proof))
                while head := conn.recv(protocol.REQUEST.size, socket.MSG_WAITALL):
                    request = protocol.parse_request(head)
                    ks = protocol.split_keys(conn.recv(16 * request.num_keys, socket.MSG_WAITALL))
                    conn.sendall(protocol.pack_answer(protocol.OK, len(ks)))
                    if request.op == protocol.LOOKUP:  # "I hold them all"
                        conn.sendall(b"\x01" * len(ks))
                        continue
                    for key in ks:
                        conn.sendall(b"\x01" + self.answer(key))

    def close(self) -> None:
        self.listener.close()


def test_a_chunk_sealed_with_another_secret_never_reaches_the_caller() -> None:
    genuine = torch.arange(16, dtype=torch.float32).view(4, 4)
    foreign = codec.encode_chunk  # the hostile peer holds the handshake key but seals with OTHER

    def answer(key: ChunkKey) -> bytes:
        encoded = foreign(key, genuine + 1, trust=trust(OTHER))
        return encoded.header + bytes(encoded.payload)

    peer = HostilePeer(KEYS, answer)
    tier = PeerTier(peers=[peer.address], trust=trust(KEYS), name="peer")
    try:
        out = torch.zeros(4, 4)
        assert tier.get_many_into(keys(1), [out]) == [False]  # a miss
        assert tier.stats().corrupt == 1
    finally:
        tier.close()
        peer.close()


def test_a_header_declaring_3_gib_is_refused_before_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The finding: a hostile peer made an engine attempt a 3 GiB allocation."""
    three_gib = 3 << 30

    def answer(key: ChunkKey) -> bytes:
        from kvstack.kv.format import encode_header

        return encode_header(key, "float16", (3, 1 << 29), b"", three_gib, checksum=0)

    allocations: list[object] = []
    real = codec.tensor_for
    monkeypatch.setattr(
        "kvstack.kv.tiers.peer.client.tensor_for", lambda h: allocations.append(h) or real(h)
    )
    peer = HostilePeer(None, answer)
    tier = PeerTier(peers=[peer.address], trust=ChunkTrust(max_chunk_bytes=64 << 20), name="p")
    try:
        assert tier.get(keys(1)[0]) is None  # no buffer given: bounded by the layout
        assert allocations == []
        assert tier.stats().corrupt == 1
    finally:
        tier.close()
        peer.close()
