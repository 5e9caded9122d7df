"""KVStackConnector inside real vLLM engines (CPU build), through the OpenAI server.

The story, on one shared disk directory: a reference engine without kvstack computes every
answer; engine A (cpu + file tiers) computes the same prompts once (storing their chunks) and
again (loading them) and must answer identically; tenants (cache_salt) and LoRA adapters never
share chunks; A restarts and still hits from disk; engine B, another process with only the file
tier, loads what A stored; a chunk corrupted on disk is recomputed, not loaded. vLLM's own prefix
cache is off in these engines so that every repeat goes through the connector.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstack.integrations.plan import block_aligned_hit
from kvstack.models.toy import build_toy_lora
from kvstack.stack.vllm_server import VLLMServer, connector_config
from tests.e2e.engines import booting, complete, launch_engine, metric_total, wait_metric

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHUNK = 256
BLOCK = 128  # vLLM's CPU default
HITS = "kvstack_connector_hit_tokens_total"
# Below one chunk, one chunk exactly, remainders, chunk multiples, and past 8K (chunked prefill).
LENGTHS = (100, 256, 700, 1024, 1500, 8300)


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(length)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("connector")


@pytest.fixture(scope="module")
def loras(toy_model: Path, workdir: Path) -> list[str]:
    paths = [build_toy_lora(toy_model, workdir / f"lora{i}", seed=i) for i in (1, 2)]
    return ["--lora-modules", *(f"ad{i}@v1={p}" for i, p in enumerate(paths, 1))]


def engine(
    toy_model: Path,
    workdir: Path,
    name: str,
    tiers: list[str] | None,
    extra: list[str],
    **settings: Any,
) -> VLLMServer:
    """Launched, not yet awaited (``.wait_ready()``)."""
    config = None if tiers is None else connector_config(tiers, chunk_size=CHUNK, **settings)
    return launch_engine(
        toy_model,
        workdir,
        name,
        kv_transfer_config=config,
        enable_lora=True,
        max_loras=2,
        extra_args=["--no-enable-prefix-caching", *extra],
    )


def tiers_a(workdir: Path) -> list[str]:
    return ["cpu://?size=256MiB", f"file://{workdir / 'shared-kv'}?size=2GiB"]


@pytest.fixture(scope="module")
def engines(toy_model: Path, workdir: Path, loras: list[str]) -> Iterator[dict[str, VLLMServer]]:
    """The module's three long-lived engines boot together; each fixture waits for its own.
    Engine B reads the shared directory at request time, so booting it early changes nothing.
    A copies layer by layer (the default, also on the CPU build), B whole steps at a time: both
    of the worker's copy paths run on a real engine."""
    b_tiers = [f"file://{workdir / 'shared-kv'}?size=2GiB"]
    servers = {
        "reference": engine(toy_model, workdir, "reference", None, loras),
        "engine-a": engine(toy_model, workdir, "engine-a", tiers_a(workdir), loras),
        "engine-b": engine(toy_model, workdir, "engine-b", b_tiers, loras, layer_pipelining=False),
    }
    with booting(servers):
        yield servers


@pytest.fixture(scope="module")
def reference(engines: dict[str, VLLMServer]) -> VLLMServer:
    return engines["reference"].wait_ready()


@pytest.fixture(scope="module")
def engine_a(engines: dict[str, VLLMServer]) -> VLLMServer:
    return engines["engine-a"].wait_ready()


def test_loaded_kv_gives_the_tokens_recomputation_gives(
    reference: VLLMServer, engine_a: VLLMServer
) -> None:
    before = metric_total(engine_a, HITS)
    expected_hits = 0
    for seed, length in enumerate(LENGTHS):
        tokens = prompt(length, seed)
        want = complete(reference, tokens)
        assert complete(engine_a, tokens) == want, f"{length} tokens, first (storing) run"
        assert complete(engine_a, tokens) == want, f"{length} tokens, second (loading) run"
        expected_hits += block_aligned_hit(length // CHUNK * CHUNK, length, BLOCK)
    assert expected_hits > 8000
    assert wait_metric(engine_a, HITS, before + expected_hits) == before + expected_hits


def test_the_engines_copy_as_configured(
    workdir: Path, engine_a: VLLMServer, engine_b: VLLMServer
) -> None:
    """The worker logs its copy modes once it has registered the paged buffer."""
    assert "layer pipelining on" in (workdir / "engine-a.log").read_text()
    assert "layer pipelining off" in (workdir / "engine-b.log").read_text()


def test_tenants_and_adapters_never_share_chunks(
    reference: VLLMServer, engine_a: VLLMServer, workdir: Path
) -> None:
    tokens = prompt(1024, seed=99)
    hits = metric_total(engine_a, HITS)
    for extra in (
        {"cache_salt": "tenant-1"},
        {"cache_salt": "tenant-2"},
        {"model": "ad1@v1"},
        {"model": "ad2@v1"},
    ):
        kwargs = dict(extra)
        model = str(kwargs.pop("model", "toy"))
        assert complete(engine_a, tokens, model=model, **kwargs) == complete(
            reference, tokens, model=model, **kwargs
        )
        assert wait_metric(engine_a, HITS, hits + 1, timeout_s=1.0) == hits, (
            f"{extra} reused another namespace"
        )
    # Each namespace now holds its own copy; asking again hits within the namespace only.
    assert complete(engine_a, tokens, model="ad1@v1") == complete(reference, tokens, model="ad1@v1")
    assert wait_metric(engine_a, HITS, hits + 896) == hits + 896
    files = list((workdir / "shared-kv").rglob("*.kvc"))
    assert len(files) >= 4 * 4 + sum(n // CHUNK for n in LENGTHS)


def test_a_restarted_engine_still_hits_its_disk_tier(
    toy_model: Path, workdir: Path, loras: list[str], reference: VLLMServer, engine_a: VLLMServer
) -> None:
    engine_a.stop()
    restarted = engine(
        toy_model, workdir, "engine-a-restarted", tiers_a(workdir), loras
    ).wait_ready()
    try:
        tokens = prompt(LENGTHS[-1], seed=len(LENGTHS) - 1)  # stored by engine A before it stopped
        assert complete(restarted, tokens) == complete(reference, tokens)
        assert wait_metric(restarted, HITS, 8192) == 8192
        assert complete(restarted, SHARED) == complete(reference, SHARED)  # stores it for B
    finally:
        restarted.stop()


SHARED = prompt(3000, seed=1234)


@pytest.fixture(scope="module")
def engine_b(engines: dict[str, VLLMServer]) -> VLLMServer:
    """Another process sharing only the disk directory."""
    return engines["engine-b"].wait_ready()


def test_another_instance_loads_what_the_first_stored(
    reference: VLLMServer, engine_b: VLLMServer
) -> None:
    assert complete(engine_b, SHARED) == complete(reference, SHARED)
    assert wait_metric(engine_b, HITS, 2816) == 2816  # 11 chunks of 256 tokens


def test_auto_loads_a_small_disk_hit_within_the_step(
    reference: VLLMServer, engine_b: VLLMServer, workdir: Path
) -> None:
    """load_mode=auto: a disk load of a few chunks goes into the step (measured there, or as
    the probe that measures it), and computes what vLLM computes."""
    tokens = prompt(4 * CHUNK + 40, seed=4242)
    want = complete(reference, tokens)
    before = set((workdir / "shared-kv").rglob("*.kvc"))
    assert complete(engine_b, tokens) == want  # computes and stores 4 chunks
    wait_for_files(workdir / "shared-kv", before, 4)
    chosen = metric_total(engine_b, "kvstack_connector_cost_sync_loads_total")
    assert complete(engine_b, tokens) == want  # no prefix caching of its own: kvstack loads
    assert (
        wait_metric(engine_b, "kvstack_connector_cost_sync_loads_total", chosen + 1) >= chosen + 1
    )


def test_a_corrupt_chunk_is_recomputed_not_loaded(
    reference: VLLMServer, engine_b: VLLMServer, workdir: Path
) -> None:
    tokens = prompt(2048, seed=77)
    want = complete(reference, tokens)
    before = set((workdir / "shared-kv").rglob("*.kvc"))
    assert complete(engine_b, tokens) == want  # computes and stores 8 chunks in the background
    new = wait_for_files(workdir / "shared-kv", before, 8)
    victim = sorted(new)[3]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the payload
    victim.write_bytes(bytes(data))
    failed = metric_total(engine_b, "kvstack_connector_load_failed_chunks_total")
    assert complete(engine_b, tokens) == want
    assert (
        wait_metric(engine_b, "kvstack_connector_load_failed_chunks_total", failed + 1)
        >= failed + 1
    )
    assert wait_metric(engine_b, "kvstack_connector_tier_corrupt_total", 1, tier="file") >= 1
    assert not victim.exists() or victim.read_bytes() != bytes(data)  # dropped (maybe re-stored)


def wait_for_files(root: Path, before: set[Path], count: int, timeout_s: float = 30.0) -> set[Path]:
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        new = set(root.rglob("*.kvc")) - before
        if len(new) >= count or time.monotonic() > deadline:
            assert len(new) >= count, f"only {len(new)} of {count} chunks reached the disk tier"
            return new
        time.sleep(0.2)
