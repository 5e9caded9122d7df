"""Asynchronous loads fetched by a real helper process (``load_fetch=process``): the shared
tiers read there into shared memory, the worker's own memory tier read here, MACs checked
there, a timed-out load's slots kept until the helper answers, and a dead helper's loads
recomputed and later ones fetched on threads again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvstack.errors import ConfigError
from kvstack.integrations.vllm.fetch_process import SEND_TIMEOUT_S, FetchProcess, helper_tiers
from kvstack.integrations.vllm.loads import AsyncLoader, FinishedLoads
from kvstack.integrations.vllm.stats import TIER_COUNTERS
from kvstack.integrations.vllm.streams import InlineStream
from kvstack.kv.cache import KVCache
from kvstack.kv.config import KVConfig
from kvstack.security import SecurityConfig, load_keys
from tests.integrations.vllm.paged import CHUNK, SHAPE, chunk_of, paged_kv
from tests.integrations.vllm.test_loads import KEYS, request
from tests.integrations.vllm.test_loads import wait_finished as wait_for
from tests.kv.tiers.remote.servers import RedisServer


def wait_finished(loader: AsyncLoader) -> FinishedLoads:
    return wait_for(loader, timeout_s=30.0)  # the helper takes a while to start on a busy host


def secured(tmp_path: Path) -> SecurityConfig:
    secret = tmp_path / "secret"
    secret.write_text(os.urandom(32).hex())  # text: raw bytes may end in whitespace
    secret.chmod(0o600)
    return SecurityConfig(cluster_secret_file=str(secret))


class Rig:
    """A worker-side cache and a deferring loader whose helper process reads its shared tiers."""

    def __init__(self, tiers: list[str], security: SecurityConfig, timeout_s: float = 30.0):
        self.config = KVConfig(model="test", chunk_size=CHUNK, tiers=tiers)
        self.security = security
        self.cache = KVCache(self.config, keys=load_keys(security))
        self.fetcher = FetchProcess(
            self.config, security, helper_tiers(tiers), SHAPE, 4, 2,
            TIER_COUNTERS,
        )  # fmt: skip
        paged, self.memory = paged_kv()
        self.loader = AsyncLoader(
            self.cache, SHAPE, 0, lambda: paged, InlineStream(), 1, timeout_s, 1, 4,
            self.fetcher, self.cache.tiers[0],
        )  # fmt: skip

    def close(self) -> None:
        self.loader.close()
        self.cache.close()

    def in_slow_tier_only(self) -> None:
        """Chunks 0 and 1 stored, then dropped from the worker's memory tier."""
        self.cache.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
        assert self.cache.flush(10)
        for key in KEYS[:2]:
            self.cache.tiers[0].remove(key)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    if server.proc is not None:
        os.killpg(server.proc.pid, signal.SIGCONT)
    server.kill()


def test_the_helper_reads_the_shared_tiers_and_the_worker_its_own_memory(tmp_path: Path) -> None:
    disk = f"file://{tmp_path / 'kv'}?size=64MiB"
    writer = KVCache(KVConfig(model="test", chunk_size=CHUNK, tiers=[disk]))
    writer.put_chunks(KEYS[1:3], [chunk_of(2), chunk_of(3)])  # another process's chunks
    writer.close()
    rig = Rig(["cpu://?size=4MiB", disk], SecurityConfig())
    try:
        assert rig.fetcher.pid != os.getpid()
        argv = Path(f"/proc/{rig.fetcher.pid}/cmdline").read_bytes().split(b"\0")
        assert all(arg.isdigit() for arg in argv[3:] if arg), argv  # descriptors, no URL
        assert rig.cache.tiers[0].put(KEYS[0], chunk_of(1))  # in this worker's memory only
        rig.loader.submit(request([[0, 1], [2, 3], [4, 5]]))
        finished = wait_finished(rig.loader)
        assert finished.req_ids == {"r1"} and not finished.failed_blocks
        assert finished.loaded_blocks == 6 and finished.helper_chunks == 2
        [write] = finished.deferred
        for staged, value in zip(write.staged, (1, 2, 3), strict=True):
            assert torch.equal(staged, chunk_of(value))
            slab = rig.fetcher.slab.untyped_storage().data_ptr()
            assert staged.untyped_storage().data_ptr() == slab  # shared with the helper
        assert int(rig.memory.sum()) == 0, "the next step writes a deferred load"
        assert rig.loader.take_tier_counts()["tier:file:hits"] == 2  # the helper's reads
        assert rig.loader.lent_buffers == 3
        write.release()
        assert rig.loader.lent_buffers == 0
        rig.loader.submit(request([[0, 1], [2, 3], [4, 5], [6, 7]], "r2"))  # chunk 3: nowhere
        finished = wait_finished(rig.loader)
        assert finished.failed_blocks == {6, 7} and finished.loaded_blocks == 6
        finished.deferred[0].release()
    finally:
        rig.close()


def test_a_chunk_failing_its_mac_in_the_helper_is_recomputed(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    import redis

    url = f"{redis_server.url}?prefix=t:"
    rig = Rig(["cpu://?size=4MiB", url], secured(tmp_path))
    try:
        # Sealed with the cluster's key, as a worker stores them, then chunk 1 altered in Redis
        assert rig.cache.tiers[1].put(KEYS[0], chunk_of(1))
        assert rig.cache.tiers[1].put(KEYS[1], chunk_of(2))
        assert rig.cache.flush(10)
        client = redis.Redis(port=redis_server.port)
        name = b"t:" + bytes(KEYS[1]).hex().encode()
        value = client.get(name)
        assert isinstance(value, bytes)
        client.setrange(name, len(value) - 1, bytes([value[-1] ^ 1]))
        client.close()
        rig.loader.submit(request([[0, 1], [2, 3]]))
        finished = wait_finished(rig.loader)
        assert finished.failed_blocks == {2, 3} and finished.loaded_blocks == 2
        [write] = finished.deferred
        assert len(write.staged) == 1 and torch.equal(write.staged[0], chunk_of(1))
        write.release()
        assert rig.loader.take_tier_counts().get("tier:redis:corrupt", 0) >= 1
    finally:
        rig.close()


def test_a_timed_out_helper_load_keeps_its_slots_until_the_helper_answers(
    redis_server: RedisServer,
) -> None:
    tiers = ["cpu://?size=4MiB", f"{redis_server.url}?prefix=t:&timeout_s=30"]
    rig = Rig(tiers, SecurityConfig(), 0.3)
    try:
        assert redis_server.proc is not None
        rig.in_slow_tier_only()
        os.killpg(redis_server.proc.pid, signal.SIGSTOP)  # the helper's read hangs
        rig.loader.submit(request([[0, 1], [2, 3]]))
        finished = wait_finished(rig.loader)
        assert finished.timeouts == 1 and finished.failed_blocks == {0, 1, 2, 3}
        assert finished.deferred == [] and rig.loader.lent_buffers == 2  # the helper may write
        os.killpg(redis_server.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while rig.loader.lent_buffers:
            assert time.monotonic() < deadline, "the helper's late answer never gave back slots"
            assert rig.loader.take_finished().req_ids == set()  # reported once only
            time.sleep(0.01)
        assert int(rig.memory.sum()) == 0, "a late answer was written"
    finally:
        rig.close()


def test_a_dead_helpers_loads_are_recomputed_and_threads_fetch_the_next(
    redis_server: RedisServer,
) -> None:
    rig = Rig(["cpu://?size=4MiB", f"{redis_server.url}?prefix=t:&timeout_s=30"], SecurityConfig())
    try:
        assert redis_server.proc is not None
        rig.in_slow_tier_only()
        os.killpg(redis_server.proc.pid, signal.SIGSTOP)
        rig.loader.submit(request([[0, 1], [2, 3]]))
        time.sleep(0.3)  # sent: the helper is reading
        os.kill(rig.fetcher.pid, signal.SIGKILL)
        finished = wait_finished(rig.loader)
        assert finished.failed_blocks == {0, 1, 2, 3} and finished.timeouts == 0
        assert not rig.fetcher.alive
        for write in finished.deferred:  # nothing arrived: no chunk to write
            assert write.staged == []
            write.release()
        assert rig.loader.lent_buffers == 0
        os.killpg(redis_server.proc.pid, signal.SIGCONT)
        rig.loader.submit(request([[0, 1], [2, 3]], "r2"))  # on the worker's threads now
        finished = wait_finished(rig.loader)
        assert not finished.failed_blocks and finished.helper_chunks == 0
        [write] = finished.deferred
        assert torch.equal(write.staged[1], chunk_of(2))
        write.release()
    finally:
        rig.close()


def test_a_helper_that_cannot_open_its_tiers_says_why(tmp_path: Path) -> None:
    config = KVConfig(model="test", chunk_size=CHUNK, tiers=["cpu://?size=4MiB"])
    with pytest.raises(ConfigError, match=r"could not start.*bogus"):
        FetchProcess(
            config, SecurityConfig(), [("file", f"file://{tmp_path}?size=1MiB&bogus=1")],
            SHAPE, 4, 1, TIER_COUNTERS,
        )  # fmt: skip


def test_a_step_end_waiting_for_a_helper_load_takes_its_answer(tmp_path: Path) -> None:
    disk = f"file://{tmp_path / 'kv'}?size=64MiB"
    rig = Rig(["cpu://?size=4MiB", disk], SecurityConfig())
    try:
        rig.in_slow_tier_only()
        rig.loader.submit(request([[0, 1], [2, 3]]))
        assert rig.loader.wait_near(20.0, 0.0) == (1, 1)  # predicted done at once: waited for
        finished = rig.loader.take_finished()
        assert finished.req_ids == {"r1"} and finished.helper_chunks == 2
        finished.deferred[0].release()
    finally:
        rig.close()


def test_a_helper_that_takes_no_job_is_killed_at_the_send_deadline(tmp_path: Path) -> None:
    rig = Rig(["cpu://?size=4MiB", f"file://{tmp_path / 'kv'}?size=64MiB"], SecurityConfig())
    try:
        os.kill(rig.fetcher.pid, signal.SIGSTOP)  # hung: it reads nothing more
        many = 100_000  # keys a frame larger than the socket's buffer (within MAX_FRAME)
        started = time.monotonic()
        assert not rig.fetcher.submit(1, [bytes(KEYS[0])] * many, list(range(many)))
        assert time.monotonic() - started < SEND_TIMEOUT_S + 5
        assert not rig.fetcher.alive
        deadline = time.monotonic() + 10
        while Path(f"/proc/{rig.fetcher.pid}").exists() and _state(rig.fetcher.pid) != "Z":
            assert time.monotonic() < deadline, "the hung helper was not killed"
            time.sleep(0.05)
    finally:
        rig.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
