"""Engines attached to kvstack tiers load each other's prefixes instead of recomputing them.

The prompt has 90 tokens: a tier with 32-token chunks holds 64 of them, while the engine's
own prefix cache (16-token blocks) would give 80, so the two kinds of hit are told apart.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvstack.sim.config import SimConfig
from kvstack.sim.engine import SimEngine
from kvstack.sim.server import FleetThread, SimEngineSpec
from kvstack.stack.ports import free_port
from tests.sim.conftest import FleetFactory

PROMPT = [200 + i for i in range(90)]
TIER_HIT = 64


def cached_tokens(url: str) -> int:
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def wait_stored(engine: SimEngine) -> None:
    """Stores run in the background; wait until the tier holds the prompt's chunks."""
    assert engine.tier is not None
    deadline = time.monotonic() + 20  # the first store imports torch
    while engine.tier.cache.lookup(PROMPT) < TIER_HIT:
        assert time.monotonic() < deadline, "the prompt never reached the tier"
        time.sleep(0.05)


def metric_values(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_fleet_shares_one_cpu_tier(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(num=2, time_scale=50, kv_tiers=["cpu://?size=16MiB"], kv_chunk_size=32)
    assert cached_tokens(fleet.urls[0]) == 0
    wait_stored(fleet.engines[1])  # the same cache object serves both engines
    assert cached_tokens(fleet.urls[1]) == TIER_HIT
    values = metric_values(fleet.urls[1])
    assert values["vllm:external_prefix_cache_hits_total"] == TIER_HIT
    assert values["vllm:prefix_cache_hits_total"] == 0


def test_separate_engines_share_a_file_tier(tmp_path: Path) -> None:
    config = SimConfig(time_scale=50, kv_tiers=[f"file://{tmp_path}?size=64MiB"], kv_chunk_size=32)
    with FleetThread([SimEngineSpec(config, free_port())]) as a:
        assert cached_tokens(a.urls[0]) == 0
        wait_stored(a.engines[0])
    with FleetThread([SimEngineSpec(config, free_port())]) as b:  # a new cache over the same files
        assert cached_tokens(b.urls[0]) == TIER_HIT


def test_a_tier_hit_costs_transfer_time_not_prefill(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(
        num=2, time_scale=5, kv_tiers=["cpu://?size=16MiB"], kv_chunk_size=32,
        prefill_tokens_per_s=1000.0, step_base_s=0.01, kv_bytes_per_token=1000,
        tier_bytes_per_s=4e6,
    )  # fmt: skip
    cached_tokens(fleet.urls[0])
    wait_stored(fleet.engines[1])
    assert cached_tokens(fleet.urls[1]) == TIER_HIT
    values = metric_values(fleet.urls[1])
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    ttft_s = values["vllm:time_to_first_token_seconds_sum"]
    # base 0.01 + 64 tokens loaded at 1000 B / 4 MB/s (0.016) + 26 prefilled at 1000/s (0.026);
    # recomputing all 90 would take 0.1 s.
    expected = 0.01 + 0.016 + 0.026
    lag_s = values["kvstack_sim_step_lag_seconds_total"] * 5  # this machine's delays, if any
    assert expected * 0.999 <= ttft_s <= expected * 1.001 + lag_s
