"""The connector in a production-like engine: vLLM's own prefix cache on, a small KV budget.

kvstack must extend vLLM's prefix cache, not replace it: a repeat within vLLM's cache never
touches kvstack, and once vLLM has lost the blocks kvstack serves them. Under memory pressure
requests are preempted and resume from kvstack, and clients disconnect mid-stream; answers
agree with an unhurried run and the connector keeps no state for requests that are gone. A
terminated engine writes what it still had queued before it exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstack.bench.micro.vllm_probe import reset_prefix_cache
from kvstack.stack.vllm_server import VLLMServer, connector_config
from tests.e2e.engines import (
    Answer,
    agenerate,
    complete,
    first_disagreement,
    generate,
    metric_total,
    start_engine,
    wait_log,
    wait_metric,
)
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HITS = "kvstack_connector_hit_tokens_total"
PREEMPTED = "kvstack_connector_preempted_requests_total"
RESUMED = "kvstack_connector_resumed_requests_total"
RECOVERIES = "kvstack_connector_preemption_recoveries_total"
DEFERRALS = "kvstack_connector_lookup_deferrals_total"
# Measured between correct runs under different batch compositions: logprob gaps up to ~1e-3.
LOGPROB_TOL = 0.02
NEAR_TIE = 0.02


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(length)]


@pytest.fixture(scope="module")
def engine(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    work = tmp_path_factory.mktemp("lifecycle")
    server = start_engine(
        toy_model,
        work,
        "lifecycle",
        max_model_len=4096,
        kv_transfer_config=connector_config(
            ["cpu://?size=128MiB", f"file://{work / 'kv'}?size=1GiB"], chunk_size=256
        ),
        # 48 blocks of 128 tokens: four long requests cannot all stay resident.
        extra_args=["--num-gpu-blocks-override", "48", "--max-num-seqs", "4"],
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    yield server
    server.stop()


def test_kvstack_serves_only_what_vllm_no_longer_holds(engine: VLLMServer) -> None:
    tokens = prompt(1500, seed=1)
    want = complete(engine, tokens)  # computed; stored in kvstack
    hits = metric_total(engine, HITS)
    assert complete(engine, tokens) == want  # vLLM's own prefix hit
    assert wait_metric(engine, HITS, hits + 1, timeout_s=1.0) == hits
    reset_prefix_cache(engine)  # vLLM forgets; kvstack still has the chunks
    assert complete(engine, tokens) == want
    assert wait_metric(engine, HITS, hits + 1280) == hits + 1280


def test_preemption_with_loaded_prompts(engine: VLLMServer) -> None:
    """Three requests whose prompts come from kvstack outgrow the KV budget and get preempted;
    the preempted ones resume from the chunks kvstack saved, generated tokens included.

    Each grows to 4000 tokens (32 of the 48 blocks), so any two of them running side by side
    for a while must preempt. The reference is each request answered alone. Batch composition
    changes the last bits of the CPU build's numerics, and the random toy model has many
    near-ties, so a correct run may flip one: every answer must agree with its reference
    token for token and logprob for logprob (within ``LOGPROB_TOL``) up to a first divergence
    that is a near-tie of the reference (its top two within ``NEAR_TIE``), over all 3000
    tokens, before and after the preemption. Wrong KV, loaded or recovered, moves logprobs by
    far more and flips tokens that are not ties.

    The requests go out together from one event loop, but the engine may still run them one
    after another (seen on a busy two-core host: one running, none waiting); then nothing is
    preempted and the round is repeated, up to three rounds.
    """
    total = 3000
    prompts = [prompt(1000, seed=10 + i) for i in range(3)]
    alone = [generate(engine, p, max_tokens=total, ignore_eos=True) for p in prompts]
    preempted_before = metric_total(engine, PREEMPTED)
    resumed_before = metric_total(engine, RESUMED)
    recoveries_before = metric_total(engine, RECOVERIES)
    rounds: list[str] = []
    for _ in range(3):
        reset_prefix_cache(engine)
        preemptions = metric_total(engine, PREEMPTED)
        vllm_preemptions = metric_total(engine, "vllm:num_preemptions_total")
        hits = metric_total(engine, HITS)
        together, finished = asyncio.run(_together(engine, prompts, total))
        assert [len(t.token_ids) for t in together] == [total] * 3
        for i, (want, got) in enumerate(zip(alone, together, strict=True)):
            problem = first_disagreement(want, got, LOGPROB_TOL, NEAR_TIE)
            assert problem is None, f"request {i}: {problem}"
        assert wait_metric(engine, HITS, hits + 3 * 768) >= hits + 3 * 768  # prompts loaded
        # The connector counts the preemptions vLLM's scheduler hands it each step. vLLM's own
        # counter, built from per-request events, is reported beside it.
        preempted = wait_metric(engine, PREEMPTED, preemptions + 1, timeout_s=10)
        vllm_count = metric_total(engine, "vllm:num_preemptions_total") - vllm_preemptions
        rounds.append(f"finished at {finished} s, vLLM counted {vllm_count}")
        if preempted > preemptions:
            break
    else:
        pytest.fail(f"no preemption in {len(rounds)} rounds: {rounds}")
    # Every preempted request was scheduled again (all three completed), and resumed with KV
    # from kvstack for the chunks vLLM's own cache no longer held.
    want = resumed_before + metric_total(engine, PREEMPTED) - preempted_before
    assert wait_metric(engine, RESUMED, want) == want
    assert metric_total(engine, RECOVERIES) > recoveries_before


async def _together(
    engine: VLLMServer, prompts: list[list[int]], max_tokens: int
) -> tuple[list[Answer], list[float]]:
    """Greedy answers to ``prompts`` sent at once, and when each finished."""
    start = time.monotonic()

    async def timed(client: httpx.AsyncClient, tokens: list[int]) -> tuple[Answer, float]:
        out = await agenerate(client, engine, tokens, max_tokens=max_tokens, ignore_eos=True)
        return out, round(time.monotonic() - start, 1)

    async with httpx.AsyncClient() as client:
        results = await asyncio.gather(*(timed(client, p) for p in prompts))
    return [out for out, _ in results], [at for _, at in results]


def test_disconnected_clients_leave_no_connector_state(engine: VLLMServer) -> None:
    def disconnect_after_first_tokens(seed: int) -> None:
        body = {
            "model": "toy",
            "prompt": prompt(1200, seed=seed),
            "max_tokens": 400,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=120) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 3:
                    return  # closing the stream aborts the request in vLLM

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(disconnect_after_first_tokens, range(100, 106)))
    assert complete(engine, prompt(300, seed=7), max_tokens=4)  # one more step after the aborts
    deadline = time.monotonic() + 10
    while (
        metric_total(engine, "kvstack_connector_tracked_requests") and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert metric_total(engine, "kvstack_connector_tracked_requests") == 0


def test_a_stalled_tier_defers_lookups_and_loses_no_writes_at_shutdown(
    toy_model: Path, tmp_path: Path
) -> None:
    """Redis stops answering (paused). A new request's lookup waits on it; vLLM's scheduler is
    told the hit is not known yet (it steps on and asks again) until the lookup times out and
    the request is computed.

    Then SIGTERM to the API server alone, as Kubernetes sends it, while Redis is still paused,
    so no chunk can be in it yet: the launcher starts vLLM draining (vLLM's default aborts and
    kills the worker at once), and the worker's shutdown writes every queued chunk before the
    process exits."""
    redis_server = RedisServer(tmp_path / "redis").start()
    engine = start_engine(
        toy_model,
        tmp_path,
        "stalled",
        max_model_len=4096,
        kv_transfer_config=connector_config(
            ["cpu://?size=64MiB", f"{redis_server.url}?prefix=t:&timeout_s=30"], chunk_size=256
        ),
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    tokens = prompt(15 * 256, seed=11)  # 15 chunks to write
    try:
        assert redis_server.proc is not None and engine.proc is not None
        want = complete(engine, tokens, max_tokens=4)  # stored in both tiers
        reset_prefix_cache(engine)
        os.killpg(redis_server.proc.pid, signal.SIGSTOP)
        try:
            deferred = metric_total(engine, DEFERRALS)
            # A cpu:// hit of the same chunks needs no Redis; a new prompt's lookup does.
            assert complete(engine, tokens, max_tokens=4) == want
            fresh = prompt(15 * 256, seed=13)
            assert complete(engine, fresh, max_tokens=1)
            assert wait_metric(engine, DEFERRALS, deferred + 1) > deferred
            os.kill(engine.proc.pid, signal.SIGTERM)
            # Redis stays paused until the worker's shutdown has counted its queued writes: on a
            # busy machine the drain can take longer than any fixed sleep.
            wait_log(tmp_path / "stalled.log", "queued chunks before exit", timeout_s=120)
        finally:
            os.killpg(redis_server.proc.pid, signal.SIGCONT)
        engine.proc.wait(timeout=60)
        import redis

        client = redis.Redis(port=redis_server.port)
        stored = sum(1 for _ in client.scan_iter(match="t:*"))
        client.close()
        assert stored == 30  # the first prompt's 15 chunks and the fresh one's 15
        log = (tmp_path / "stalled.log").read_text()
        landed = re.search(r"(\d+) queued chunk writes landed before exit", log)
        assert landed and int(landed.group(1)) >= 15, "the fresh prompt's chunks were queued"
    finally:
        engine.stop()
        redis_server.kill()
