"""Per-tier Prometheus metrics, read back from the exposition text a scrape would get."""

from __future__ import annotations

import gc
import uuid
from pathlib import Path

import torch
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvstack.kv.format import HEADER_BYTES
from kvstack.kv.tiers.cpu.tier import CPUTier
from kvstack.kv.tiers.file import chunkfile
from kvstack.kv.tiers.file.tier import FileTier
from tests.kv.tiers.tier_contract import SHAPE, chunk, key

CHUNK_BYTES = 2048


def scrape(tier: str) -> dict[str, float]:
    """Samples labelled ``tier=<tier>``, by sample name (``op`` appended when present)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            if sample.labels.get("tier") != tier or sample.name.endswith("_created"):
                continue
            name = sample.name + (f":{sample.labels['op']}" if "op" in sample.labels else "")
            if "le" not in sample.labels:
                out[name] = sample.value
    return out


def test_cpu_tier_metrics() -> None:
    name = f"cpu-{uuid.uuid4().hex[:8]}"
    tier = CPUTier(2 * CHUNK_BYTES, name=name)
    for i in range(3):  # the third evicts the first
        tier.put(key(i), chunk(i))
    tier.get_into(key(2), torch.empty(SHAPE, dtype=torch.float16))
    tier.get(key(0))  # evicted: a miss
    m = scrape(name)
    assert m["kvstack_kv_tier_hits_total"] == 1 and m["kvstack_kv_tier_misses_total"] == 1
    assert m["kvstack_kv_tier_read_bytes_total"] == CHUNK_BYTES
    assert m["kvstack_kv_tier_written_bytes_total"] == 3 * CHUNK_BYTES
    assert m["kvstack_kv_tier_evictions_total"] == 1
    assert (
        m["kvstack_kv_tier_put_seconds_count"] == 3 and m["kvstack_kv_tier_get_seconds_count"] == 1
    )
    assert m["kvstack_kv_tier_used_bytes"] == 2 * CHUNK_BYTES and m["kvstack_kv_tier_entries"] == 2
    tier.remove(key(1))
    assert scrape(name)["kvstack_kv_tier_entries"] == 1  # gauges are live, not last-stats()
    tier.put(key(9), chunk(9, shape=(8, 2, 16, 2, 8)))  # larger than the tier
    assert scrape(name)["kvstack_kv_tier_dropped_writes_total"] == 1
    del tier
    gc.collect()
    assert scrape(name)["kvstack_kv_tier_entries"] == 0  # a collected tier reports nothing


def test_file_tier_metrics(tmp_path: Path) -> None:
    name = f"file-{uuid.uuid4().hex[:8]}"
    file_bytes = HEADER_BYTES + CHUNK_BYTES
    tier = FileTier(tmp_path, 2 * file_bytes, name=name)
    for i in range(3):
        tier.put(key(i), chunk(i))
    tier.flush()
    path = chunkfile.chunk_path(tmp_path, key(2))
    path.write_bytes(path.read_bytes()[:-1])  # truncated
    assert tier.get(key(2)) is None and tier.get(key(1)) is not None
    m = scrape(name)
    assert m["kvstack_kv_tier_written_bytes_total"] == 3 * file_bytes
    assert m["kvstack_kv_tier_evictions_total"] == 1 and m["kvstack_kv_tier_corrupt_total"] == 1
    assert m["kvstack_kv_tier_hits_total"] == 1 and m["kvstack_kv_tier_misses_total"] == 1
    assert m["kvstack_kv_tier_read_bytes_total"] == CHUNK_BYTES
    assert m["kvstack_kv_tier_entries"] == 1 and m["kvstack_kv_tier_used_bytes"] == file_bytes
    assert m["kvstack_kv_tier_put_seconds_count"] == 3
    tier.close()


def test_cache_counters_reach_prometheus() -> None:
    from kvstack.kv import KVCache

    def total(name: str) -> float:
        value = REGISTRY.get_sample_value(name)
        return 0.0 if value is None else value

    before = {
        n: total(n)
        for n in (
            "kvstack_kv_lookup_tokens_total",
            "kvstack_kv_lookup_hit_tokens_total",
            "kvstack_kv_stored_tokens_total",
        )
    }
    with KVCache.from_config(
        {"model": "m", "chunk_size": 16, "tiers": ["cpu://?size=1MiB"]}
    ) as cache:
        tokens = list(range(40))
        cache.store(tokens, torch.zeros(2, 2, 40, 2, 8, dtype=torch.float16))
        cache.lookup(tokens)
    assert total("kvstack_kv_stored_tokens_total") - before["kvstack_kv_stored_tokens_total"] == 32
    assert total("kvstack_kv_lookup_tokens_total") - before["kvstack_kv_lookup_tokens_total"] == 40
    assert (
        total("kvstack_kv_lookup_hit_tokens_total") - before["kvstack_kv_lookup_hit_tokens_total"]
        == 32
    )
