"""Prefill/decode handoff through a shared Redis tier, with two real vLLM engines (CPU build).

The prefill engine runs the connector as ``kv_producer`` (it saves, synchronously, and never
loads: its own answers are single-engine answers); the decode engine runs it as
``kv_consumer`` (it only loads). For each prompt the prefill engine answers first, which stores
the prompt's chunks in Redis; the decode engine then answers the same prompt by loading those
chunks instead of computing them, and must produce the same tokens. Then Redis dies: both
engines keep answering correctly by recomputing, and no request fails.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstack.integrations.plan import block_aligned_hit
from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec, connector_config
from tests.e2e.engines import complete, metric_total, wait_metric
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = [pytest.mark.vllm, pytest.mark.redis, pytest.mark.slow]

CHUNK = 256
BLOCK = 128  # vLLM's CPU default
HITS = "kvstack_connector_hit_tokens_total"


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(length)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pd")


@pytest.fixture(scope="module")
def redis(workdir: Path) -> Iterator[RedisServer]:
    server = RedisServer(workdir / "redis").start()
    yield server
    server.stop()


def _engine(toy_model: Path, workdir: Path, name: str, role: str, url: str) -> VLLMServer:
    tiers = [url] if role == "kv_producer" else ["cpu://?size=256MiB", url]
    spec = VLLMServerSpec(
        model=str(toy_model), port=free_port(), served_model_name="toy",
        kv_transfer_config=connector_config(tiers, role=role, chunk_size=CHUNK),
        extra_args=["--no-enable-prefix-caching"],
    )  # fmt: skip
    return VLLMServer(spec, workdir / f"{name}.log")


@pytest.fixture(scope="module")
def engines(
    toy_model: Path, workdir: Path, redis: RedisServer
) -> Iterator[tuple[VLLMServer, VLLMServer]]:
    url = f"{redis.url}?prefix=pd:&timeout_s=1&connect_timeout_s=0.2&breaker_reset_s=1"
    prefill = _engine(toy_model, workdir, "prefill", "kv_producer", url)
    decode = _engine(toy_model, workdir, "decode", "kv_consumer", url)
    try:
        for server in (prefill, decode):  # both boot at once; then wait for both
            server.launch()
        for server in (prefill, decode):
            server.wait_ready()
        yield prefill, decode
    finally:
        decode.stop()
        prefill.stop()


def test_decode_engine_continues_from_the_prefill_engines_kv(
    engines: tuple[VLLMServer, VLLMServer], redis: RedisServer
) -> None:
    prefill, decode = engines
    hits = metric_total(decode, HITS)
    for seed, length in enumerate((300, 1024, 2900)):
        tokens = prompt(length, seed)
        single = complete(prefill, tokens, max_tokens=12)  # stores the prompt's chunks
        assert complete(decode, tokens, max_tokens=12) == single, f"{length}-token prompt"
        hits += block_aligned_hit(length // CHUNK * CHUNK, length, BLOCK)
        assert wait_metric(decode, HITS, hits) == hits, "decode recomputed instead of loading"
    assert len(redis.cli("--scan", "--pattern", "pd:*").split()) == (300 + 1024 + 2900) // CHUNK


def test_no_request_fails_while_redis_is_down(
    engines: tuple[VLLMServer, VLLMServer], redis: RedisServer
) -> None:
    prefill, decode = engines
    redis.kill()
    try:
        hits = metric_total(decode, HITS)
        for seed in (10, 11):
            tokens = prompt(800, seed)
            single = complete(prefill, tokens, max_tokens=8)
            assert complete(decode, tokens, max_tokens=8) == single
        assert metric_total(decode, HITS) == hits  # nothing to load: recomputed
    finally:
        redis.start()
