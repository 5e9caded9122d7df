"""The worker's close at vLLM's shutdown, on a real redis-server tier: queued chunk writes land
within ``shutdown_flush_s`` and the log says so; a tier held up past it costs those writes (the
log says how many, as a warning) and never the shutdown itself."""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kvstack.integrations.settings import ConnectorSettings, TransferModes
from kvstack.integrations.vllm import worker as worker_module
from kvstack.integrations.vllm.worker import WorkerSide
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import ChunkKey
from tests.integrations.vllm.paged import CHUNK, chunk_of, layout
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]
CHUNKS = 12


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


def worker(server: RedisServer, flush_s: float, monkeypatch: pytest.MonkeyPatch) -> WorkerSide:
    # The test process is not a vLLM worker: keep its CPU affinity as it is.
    monkeypatch.setattr(worker_module, "_on_cpu_build", lambda: False)
    kv = KVConfig(
        model="flush-test",
        chunk_size=CHUNK,
        tiers=["cpu://?size=4MiB", f"{server.url}?prefix=f:&timeout_s=5"],
    )
    settings = ConnectorSettings(shutdown_flush_s=flush_s)
    modes = TransferModes(copy_out_background=False, layer_pipelining=False)
    return WorkerSide(kv, layout(), f"flush-{os.getpid()}-{time.time_ns()}", settings, modes, True)


def put(side: WorkerSide) -> None:
    keys = [ChunkKey(bytes([n]) * 16) for n in range(CHUNKS)]
    assert side.cache.put_chunks(keys, [chunk_of(n) for n in range(CHUNKS)]) == CHUNKS


def stored(server: RedisServer) -> int:
    with redis.Redis(port=server.port) as client:
        return sum(1 for _ in client.scan_iter("f:*"))


def test_queued_writes_land_at_close(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    side = worker(redis_server, 10.0, monkeypatch)
    assert redis_server.proc is not None
    os.killpg(redis_server.proc.pid, signal.SIGSTOP)  # the writes queue up behind Redis
    try:
        put(side)
    finally:
        os.killpg(redis_server.proc.pid, signal.SIGCONT)
    with caplog.at_level(logging.INFO, logger=worker_module.__name__):
        side.close()
    assert stored(redis_server) >= CHUNKS
    assert "queued chunk writes landed before exit" in caplog.text
    assert "dropped" not in caplog.text


def test_a_tier_held_up_past_the_budget_costs_its_writes_not_the_shutdown(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    side = worker(redis_server, 0.5, monkeypatch)
    assert redis_server.proc is not None
    os.killpg(redis_server.proc.pid, signal.SIGSTOP)
    try:
        put(side)
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger=worker_module.__name__):
            side.close()
        closed_s = time.monotonic() - started
    finally:
        os.killpg(redis_server.proc.pid, signal.SIGCONT)
    warning = [
        r
        for r in caplog.records
        if r.name == worker_module.__name__ and r.levelno == logging.WARNING
    ]
    assert len(warning) == 1, caplog.text
    message = warning[0].getMessage()
    assert f"of {CHUNKS} queued chunk writes had not landed" in message
    assert "raise shutdown_flush_s and VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS" in message
    assert "landed before exit" not in caplog.text
    # Out of time, the tier drops what it had not started: closing waits for the one write
    # under way (bounded by the tier's timeout), not for the rest of the queue.
    dropped = re.search(r"KV tier redis: (\d+) queued writes dropped at close \(out of time\)",
                        caplog.text)  # fmt: skip
    assert dropped and int(dropped.group(1)) >= 1, caplog.text
    # Bounded by the budget and the tier's own timeout, not by Redis coming back.
    assert closed_s < 30, closed_s
    assert stored(redis_server) < CHUNKS
