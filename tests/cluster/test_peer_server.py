"""PeerServer and PeerClient over real loopback TCP: batched lookup and get into caller
buffers, verification of what arrives, back-pressure, and bad requests."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import torch

from kvstack.cluster.config import PeerServerConfig
from kvstack.cluster.peer_server import PeerServer
from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys
from kvstack.kv.tiers.cpu.tier import CPUTier
from kvstack.kv.tiers.peer import protocol
from kvstack.kv.tiers.peer.client import PeerClient


def keys(n: int) -> list[ChunkKey]:
    return chunk_keys(list(range(n)), Namespace("peer-test"), 1)


def chunk(seed: int) -> torch.Tensor:
    return torch.randn(2, 2, 4, 2, 8, generator=torch.Generator().manual_seed(seed)).half()


@pytest.fixture
def lender() -> Iterator[tuple[CPUTier, PeerServer]]:
    tier = CPUTier(1 << 20)
    server = PeerServer([tier], PeerServerConfig(host="127.0.0.1", port=0))
    server.start_background()
    yield tier, server
    server.stop()
    tier.close()


def test_lookup_and_get_into_caller_buffers(lender: tuple[CPUTier, PeerServer]) -> None:
    tier, server = lender
    ks, chunks = keys(4), [chunk(i) for i in range(4)]
    tier.put_many(ks[:3], chunks[:3])
    client = PeerClient(f"127.0.0.1:{server.port}")
    assert client.lookup(ks) == [True, True, True, False]
    big = torch.zeros(2, 2, 8, 2, 8, dtype=torch.float16)
    outs = [
        torch.empty_like(chunks[0]),
        big[:, :, 2:6],
        torch.empty(3),
        torch.empty_like(chunks[0]),
    ]
    results = client.get(ks, outs)
    assert results is not None
    assert [r.outcome for r in results] == ["hit", "hit", "mismatch", "miss"]
    assert torch.equal(outs[0], chunks[0]) and torch.equal(big[:, :, 2:6], chunks[1])
    fresh = client.get([ks[2]], [None])  # no buffer: a new tensor of the stored shape
    assert fresh is not None and fresh[0].chunk is not None
    assert torch.equal(fresh[0].chunk, chunks[2])
    client.close()


def test_damaged_payload_is_never_loaded(lender: tuple[CPUTier, PeerServer]) -> None:
    tier, server = lender
    k, c = keys(1)[0], chunk(9)
    tier.put(k, c)
    client = PeerClient(f"127.0.0.1:{server.port}")
    results = client.get([k], [torch.empty_like(c)])
    assert results is not None and results[0].outcome == "hit"  # the header is cached now
    stored = tier.borrow(k)
    assert stored is not None
    stored.view(-1)[7] += 1  # memory corruption after the checksum was taken
    del stored
    results = client.get([k, k], [torch.empty_like(c), torch.empty_like(c)])
    assert results is not None
    assert [r.outcome for r in results] == ["corrupt", "corrupt"]  # connection stays in sync
    assert client.lookup([k]) == [True]
    client.close()


class BlockingTier(CPUTier):
    """A tier whose reads wait until the test lets them go."""

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.entered = threading.Event()
        self.release = threading.Event()

    def get(self, key: ChunkKey) -> torch.Tensor | None:
        self.entered.set()
        self.release.wait(30)
        return super().get(key)


def test_busy_server_answers_at_once_instead_of_queueing() -> None:
    tier = BlockingTier()
    server = PeerServer([tier], PeerServerConfig(host="127.0.0.1", port=0, max_streams=1))
    server.start_background()
    k, c = keys(1)[0], chunk(1)
    tier.put(k, c)
    address = f"127.0.0.1:{server.port}"
    try:
        first: list[object] = []
        reader = threading.Thread(target=lambda: first.append(PeerClient(address).get([k], [None])))
        reader.start()
        assert tier.entered.wait(30)  # the first transfer holds the only stream
        assert PeerClient(address).get([k], [None]) is None  # BUSY, while the first still waits
        tier.release.set()
        reader.join(30)
        assert first and first[0] is not None
    finally:
        tier.release.set()
        server.stop()


def test_bad_requests(lender: tuple[CPUTier, PeerServer]) -> None:
    _, server = lender
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
        hello = protocol.parse_hello(s.recv(protocol.HELLO.size, socket.MSG_WAITALL))
        assert hello.auth == protocol.AUTH_NONE  # no secret: no challenge (loopback only)
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        answer = protocol.parse_answer(s.recv(protocol.ANSWER.size, socket.MSG_WAITALL))
        assert answer.status == protocol.BAD_REQUEST  # not the protocol: told why, then closed
        assert b"not a peer request" in s.recv(answer.num, socket.MSG_WAITALL)
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:  # closed with our unread bytes still queued
            pass
    client = PeerClient(f"127.0.0.1:{server.port}")
    with pytest.raises(protocol.ProtocolError, match="max_keys_per_request"):
        client.get(keys(1) * 5000, [None] * 5000)
    assert client.lookup(keys(2)) == [False, False]  # a fresh connection works
    client.close()
