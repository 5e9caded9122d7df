"""Asynchronous loads, load failures, generated tokens and hybrid models in real vLLM engines.

Engine A keeps kvstack's chunks in a file tier only, so every kvstack load is asynchronous (the
request waits in ``WAITING_FOR_REMOTE_KVS`` while others step). vLLM's own prefix cache is on:
its hit on the same prompt is the reference a kvstack hit must reproduce bit for bit, tokens
and logprobs (prompts are sized so that both hits cover the same tokens). Engine B is another
process on the same directory: it serves the next turn of a conversation that A answered, the
answer included. Engine H runs a hybrid model (a full-attention and a sliding-window layer):
it starts, answers, and kvstack stores and serves nothing for it.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from kvstack.bench.micro.vllm_harness import DecodeStreams
from kvstack.bench.micro.vllm_probe import reset_prefix_cache
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers import make_tier
from kvstack.router.request import ADMIN_HEADER
from kvstack.stack.vllm_server import VLLMServer, connector_config
from tests.e2e.engines import (
    Answer,
    booting,
    chunk_files,
    complete,
    generate,
    launch_engine,
    metric_total,
    wait_metric,
)
from tests.router.conftest import router_config, serve_router

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHUNK = 256
ASYNC_LOADS = "kvstack_connector_async_loads_total"
DEFERRED = "kvstack_connector_deferred_write_chunks_total"
LOADED = "kvstack_connector_load_tokens_total"
FAILED = "kvstack_connector_load_failed_chunks_total"
HITS = "kvstack_connector_hit_tokens_total"
HELPER = "kvstack_connector_helper_fetched_chunks_total"
STEP_LOADS = "kvstack_connector_load_seconds_count"  # steps that waited for loads within them
QUIET_STEPS = "kvstack_connector_step_interval_seconds_count"
LOADING_STEPS = "kvstack_connector_loading_step_interval_seconds_count"
TRIES = 5  # for a load beside a running decode (see the step-interval test)


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(length)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("async")


def file_engine(model: Path, workdir: Path, name: str, **extra: Any) -> VLLMServer:
    """Launched, not yet awaited (``.wait_ready()``)."""
    tiers = [f"file://{workdir / 'kv'}?size=2GiB"]
    return launch_engine(
        model, workdir, name, max_model_len=4096,
        # async, not auto: auto would move these cheap local loads into the step once measured
        kv_transfer_config=connector_config(
            tiers, chunk_size=CHUNK, load_mode="async", request_load_mode=True, **extra
        ),
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )  # fmt: skip


def hybrid_model(toy_model: Path, workdir: Path) -> Path:
    """The toy model with a full-attention and a sliding-window layer."""
    model = workdir / "hybrid-model"
    shutil.copytree(toy_model, model)
    config = json.loads((model / "config.json").read_text())
    config.update(layer_types=["full_attention", "sliding_attention"], sliding_window=128)
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def engines(toy_model: Path, workdir: Path) -> Iterator[dict[str, VLLMServer]]:
    """The module's engines boot together; each fixture waits for its own. Engine B reads the
    shared directory at request time, so booting it early changes nothing."""
    tiers = [f"file://{workdir / 'hybrid-kv'}?size=1GiB"]
    servers = {
        "engine-a": file_engine(toy_model, workdir, "engine-a"),
        # B serves turn two with the opt-in wait at a step's end for a load about to finish,
        # its loads read by the opt-in fetch helper process
        "engine-b": file_engine(
            toy_model, workdir, "engine-b", load_finish_wait=1.0, load_fetch="process"
        ),
        "hybrid": launch_engine(
            hybrid_model(toy_model, workdir), workdir, "hybrid", max_model_len=4096,
            kv_transfer_config=connector_config(tiers, chunk_size=CHUNK),
        ),
    }  # fmt: skip
    with booting(servers):
        yield servers


@pytest.fixture(scope="module")
def engine_a(engines: dict[str, VLLMServer]) -> VLLMServer:
    return engines["engine-a"].wait_ready()


def stored(paths: list[Path], timeout_s: float = 30.0) -> list[Path]:
    """Wait until the file tier has written these chunk files."""
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"{sum(p.exists() for p in paths)}/{len(paths)} stored"
        time.sleep(0.1)
    return paths


def computed_twice(engine: VLLMServer, tokens: list[int], workdir: Path) -> Answer:
    """Compute ``tokens`` (kvstack stores its chunks), then answer from vLLM's own prefix
    cache: the reference. Returns the reference once the chunks are on disk."""
    generate(engine, tokens)
    reference = generate(engine, tokens)
    stored(chunk_files(workdir / "engine-a.log", workdir / "kv", tokens, CHUNK))
    return reference


def test_an_async_load_computes_exactly_what_vllms_own_hit_computes(
    engine_a: VLLMServer, workdir: Path
) -> None:
    tokens = prompt(5 * CHUNK + 100, seed=1)  # vLLM's hit and kvstack's both cover 1280 tokens
    reference = computed_twice(engine_a, tokens, workdir)
    loads = metric_total(engine_a, ASYNC_LOADS)
    deferred = metric_total(engine_a, DEFERRED)
    reset_prefix_cache(engine_a)
    assert generate(engine_a, tokens) == reference  # token ids and every logprob
    assert wait_metric(engine_a, ASYNC_LOADS, loads + 1) == loads + 1
    # On vLLM's CPU build the load fetched off the step and its 5 chunks were written in the
    # step that ran the request, beside the forward pass.
    assert wait_metric(engine_a, DEFERRED, deferred + 5) == deferred + 5

    # Wrong KV would show: give P's chunk files another prompt's (valid, checksummed) pages.
    with swapped_chunks(engine_a, workdir, tokens, seed=2):
        reset_prefix_cache(engine_a)
        wrong = generate(engine_a, tokens)
        assert wrong.logprobs != reference.logprobs, "wrong KV left the answer unchanged"
        assert metric_total(engine_a, ASYNC_LOADS) >= loads + 2


@contextmanager
def swapped_chunks(
    engine_a: VLLMServer, workdir: Path, tokens: list[int], seed: int, chunks: int = 5
) -> Iterator[None]:
    """The first ``chunks`` chunk files of ``tokens`` hold another prompt's pages (valid and
    checksummed, computed by engine A) until the block ends; then they are removed."""
    other = prompt(len(tokens), seed=seed)
    computed_twice(engine_a, other, workdir)
    mine = chunk_files(workdir / "engine-a.log", workdir / "kv", tokens, CHUNK)[:chunks]
    theirs = chunk_files(workdir / "engine-a.log", workdir / "kv", other, CHUNK)
    tier = make_tier(f"file://{workdir / 'kv'}?size=2GiB")
    try:
        for victim, donor in zip(mine, theirs, strict=False):
            pages = tier.get(_key(donor))
            assert pages is not None
            tier.remove(_key(victim))
            assert tier.put(_key(victim), pages)
        assert tier.flush(30)
        yield
    finally:
        for victim in mine:
            tier.remove(_key(victim))
        tier.close()


def test_the_steps_beside_an_async_load_are_timed_apart_from_the_others(
    engine_a: VLLMServer, workdir: Path
) -> None:
    tokens = prompt(4 * CHUNK + 50, seed=7)
    computed_twice(engine_a, tokens, workdir)
    quiet = metric_total(engine_a, QUIET_STEPS)
    # One decode steps beside the load. The tiny model decodes thousands of tokens a second,
    # and on two cores vLLM's API server, which streams them, may pass the loading request on
    # only when the decode has ended: then no step ran beside the load. A few tries, each with
    # the load made again, the decode a new one.
    for attempt in range(TRIES):
        loading = metric_total(engine_a, LOADING_STEPS)
        loads = metric_total(engine_a, ASYNC_LOADS)
        reset_prefix_cache(engine_a)
        with DecodeStreams(engine_a, [prompt(64, seed=8 + attempt)], max_tokens=3500) as decode:
            decode.wait_running(8)
            generate(engine_a, tokens)
            assert not decode.errors()
        assert wait_metric(engine_a, ASYNC_LOADS, loads + 1) == loads + 1
        if wait_metric(engine_a, LOADING_STEPS, loading + 1, timeout_s=2) > loading:
            break
    else:
        pytest.fail(f"no step beside an asynchronous load was timed in {TRIES} tries")
    assert metric_total(engine_a, QUIET_STEPS) > quiet


def test_a_request_may_ask_for_its_load_within_the_step(
    engine_a: VLLMServer, workdir: Path
) -> None:
    """The engine loads asynchronously, but allows requests their own mode: a request asking
    ``sync`` is loaded within its step, and computes the same as vLLM's own hit."""
    tokens = prompt(5 * CHUNK + 100, seed=3)
    reference = computed_twice(engine_a, tokens, workdir)
    loads, in_step = metric_total(engine_a, ASYNC_LOADS), metric_total(engine_a, STEP_LOADS)
    reset_prefix_cache(engine_a)
    sync = {"kvstack": {"load_mode": "sync"}}
    assert generate(engine_a, tokens, kv_transfer_params=sync) == reference
    assert wait_metric(engine_a, STEP_LOADS, in_step + 1) >= in_step + 1
    assert metric_total(engine_a, ASYNC_LOADS) == loads


async def test_through_the_router_only_the_admin_key_chooses_the_load_mode(
    engine_a: VLLMServer, workdir: Path
) -> None:
    """A client asking ``sync`` through the router is loaded as the engine loads (its
    ``kv_transfer_params`` dropped), one holding the router's admin key gets its own mode;
    both compute what vLLM's own hit computes. The official openai client asks."""
    tokens = prompt(5 * CHUNK + 100, seed=4)
    reference = computed_twice(engine_a, tokens, workdir)
    admin = "admin-key-of-this-test"
    config = router_config([engine_a.url], auth={"admin_key": admin}, health={"interval_s": 0.5})
    orders = {"kv_transfer_params": {"kvstack": {"load_mode": "sync"}}, "return_token_ids": True}
    async with serve_router(config) as router:
        client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)
        try:
            for headers, in_the_step in (({}, False), ({ADMIN_HEADER: admin}, True)):
                loads = metric_total(engine_a, ASYNC_LOADS)
                in_step = metric_total(engine_a, STEP_LOADS)
                reset_prefix_cache(engine_a)
                answer = await client.completions.create(
                    model="toy", prompt=tokens, max_tokens=8, temperature=0,
                    extra_body=orders, extra_headers=headers,
                )  # fmt: skip
                assert answer.choices[0].token_ids == reference.token_ids  # type: ignore[attr-defined]
                if in_the_step:
                    assert wait_metric(engine_a, STEP_LOADS, in_step + 1) >= in_step + 1
                    assert metric_total(engine_a, ASYNC_LOADS) == loads
                else:
                    assert wait_metric(engine_a, ASYNC_LOADS, loads + 1) == loads + 1
                    assert metric_total(engine_a, STEP_LOADS) == in_step
        finally:
            await client.close()


def _key(path: Path) -> ChunkKey:
    return ChunkKey(bytes.fromhex(path.name.removesuffix(".kvc")))


def test_a_load_failing_mid_transfer_is_recomputed_from_that_block(
    engine_a: VLLMServer, workdir: Path
) -> None:
    tokens = prompt(5 * CHUNK + 100, seed=3)
    reference = computed_twice(engine_a, tokens, workdir)
    files = chunk_files(workdir / "engine-a.log", workdir / "kv", tokens, CHUNK)
    data = bytearray(files[2].read_bytes())
    data[len(data) // 2] ^= 0xFF  # chunk 2 of 5 fails its checksum when read
    files[2].write_bytes(bytes(data))
    loaded, failed = metric_total(engine_a, LOADED), metric_total(engine_a, FAILED)
    reset_prefix_cache(engine_a)
    answer = generate(engine_a, tokens)
    assert answer.token_ids == reference.token_ids
    assert wait_metric(engine_a, FAILED, failed + 3) == failed + 3  # chunks 2, 3 and 4
    assert metric_total(engine_a, LOADED) == loaded + 2 * CHUNK  # chunks 0 and 1 were used


@pytest.fixture(scope="module")
def engine_b(engines: dict[str, VLLMServer]) -> VLLMServer:
    return engines["engine-b"].wait_ready()


def test_another_instance_serves_the_answer_of_a_first_turn(
    engine_a: VLLMServer, engine_b: VLLMServer, workdir: Path
) -> None:
    turn_one = prompt(1000, seed=5)
    # 281 generated tokens: the KV of 1280 tokens exists, chunks 3 and 4 hold generated ones.
    answer = complete(engine_a, turn_one, max_tokens=281, ignore_eos=True)
    turn_two = turn_one + answer + prompt(50, seed=6)
    reference = generate(engine_a, turn_two)  # vLLM's own hit: 1280 tokens, answer included
    stored(chunk_files(workdir / "engine-a.log", workdir / "kv", turn_two, CHUNK)[:5])
    hits = metric_total(engine_b, HITS)
    helper = metric_total(engine_b, HELPER)
    assert generate(engine_b, turn_two) == reference  # tokens and logprobs
    served = wait_metric(engine_b, HITS, hits + 5 * CHUNK) - hits
    assert served == 5 * CHUNK and served / len(turn_two) >= 0.9
    assert metric_total(engine_a, "kvstack_connector_save_generated_chunks_total") >= 2
    # B's helper process read the 5 chunks, and its tier reads count in B's metrics
    assert wait_metric(engine_b, HELPER, helper + 5) == helper + 5
    assert metric_total(engine_b, "kvstack_connector_tier_hits_total", tier="file") >= 5
    # The helper's KV is what B computes from: other pages in those files change the answer.
    with swapped_chunks(engine_a, workdir, turn_two, seed=9):
        reset_prefix_cache(engine_b)
        assert generate(engine_b, turn_two).logprobs != reference.logprobs
        assert wait_metric(engine_b, HELPER, helper + 10) == helper + 10


@pytest.fixture(scope="module")
def hybrid_engine(engines: dict[str, VLLMServer]) -> VLLMServer:
    return engines["hybrid"].wait_ready()


def test_a_hybrid_model_starts_and_is_served_without_hits(
    hybrid_engine: VLLMServer, workdir: Path
) -> None:
    tokens = prompt(1000, seed=7)
    first = complete(hybrid_engine, tokens)
    assert len(first) == 8 and complete(hybrid_engine, tokens) == first
    log = (workdir / "hybrid.log").read_text()
    assert log.count("kvstack stores nothing and serves no hit for this model") == 1
    assert "2 KV cache groups (full attention, SlidingWindow)" in log
    assert metric_total(hybrid_engine, "kvstack_connector_lookup_tokens_total") == 0
    assert not list((workdir / "hybrid-kv").rglob("*.kvc"))
