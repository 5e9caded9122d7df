"""KVCache: the tier policies, prefix semantics, failures, bad input and concurrency."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstack.errors import ConfigError, TierError
from kvstack.kv import KVCache, KVConfig
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers import Tier, TierEvent
from kvstack.kv.tiers.cpu.tier import CPUTier

C = 4  # tokens per chunk
LAYERS, HEADS, DIM = 2, 2, 8
CHUNK_BYTES = LAYERS * 2 * C * HEADS * DIM * 2  # float16


def kv_for(tokens: list[int]) -> torch.Tensor:
    """KV that depends on the whole prefix at each position, like a real model's."""
    out = torch.empty(LAYERS, 2, len(tokens), HEADS, DIM, dtype=torch.float16)
    acc = 0
    for t, tok in enumerate(tokens):
        acc = (acc * 31 + tok + 1) % 1009
        out[:, :, t] = acc / 1009.0 + torch.arange(HEADS * DIM).view(HEADS, DIM) / 64.0
    return out


def make(tmp_path: Path | None = None, **config: Any) -> KVCache:
    tiers = config.pop("tiers", None) or ["cpu://?size=64KiB"]
    if tmp_path is not None:
        tiers = [*tiers, f"file://{tmp_path}?size=1MiB"]
    return KVCache.from_config({"model": "toy@1", "chunk_size": C, "tiers": tiers, **config})


def test_store_lookup_retrieve_contiguous_prefix(tmp_path: Path) -> None:
    tokens = list(range(100, 122))  # 5 full chunks + 2 tokens
    with make(tmp_path) as cache:
        assert cache.store(tokens, kv_for(tokens)) == 20
        assert cache.lookup(tokens) == 20
        assert cache.lookup(tokens[:9]) == 8
        assert cache.lookup([*tokens[:6], 0, *tokens[7:]]) == 4  # diverges in chunk 2
        got, n = cache.retrieve(tokens)
        assert n == 20 and got is not None and torch.equal(got, kv_for(tokens)[:, :, :20])
        cache.tiers[0].remove(cache.chunk_keys(tokens)[2])
        cache.tiers[1].remove(cache.chunk_keys(tokens)[2])
        assert cache.lookup(tokens) == 8  # the first missing chunk ends the hit
        got, n = cache.retrieve(tokens)
        assert n == 8 and got is not None and torch.equal(got, kv_for(tokens)[:, :, :8])
        assert cache.retrieve([9, 9, 9, 9, 9]) == (None, 0)
        cache.check_integrity()


def test_write_through_reaches_every_tier(tmp_path: Path) -> None:
    tokens = list(range(12))
    with make(tmp_path) as cache:
        cache.store(tokens, kv_for(tokens))
        cache.flush()
        keys = cache.chunk_keys(tokens)
        assert all(t.contains_many(keys) == [True] * 3 for t in cache.tiers)


def test_write_back_demotes_evictions_and_promotes_hits(tmp_path: Path) -> None:
    cpu = f"cpu://?size={4 * CHUNK_BYTES}"
    tokens = list(range(40))  # 10 chunks; the CPU tier holds 4
    with make(tmp_path, tiers=[cpu], write_policy="write-back") as cache:
        assert cache.store(tokens, kv_for(tokens)) == 40
        cache.flush()
        cpu_tier, file_tier = cache.tiers
        keys = cache.chunk_keys(tokens)
        assert cpu_tier.contains_many(keys) == [False] * 6 + [True] * 4
        assert file_tier.contains_many(keys) == [True] * 6 + [False] * 4  # the demoted ones
        got, n = cache.retrieve(tokens)
        assert n == 40 and got is not None and torch.equal(got, kv_for(tokens))
        cache.flush()
        # Every chunk was read once; the ones read last (promoted from disk) are in DRAM now,
        # and what the promotions evicted was demoted in turn: nothing is lost.
        assert all(
            a or b
            for a, b in zip(
                cpu_tier.contains_many(keys), file_tier.contains_many(keys), strict=True
            )
        )
        assert cpu_tier.stats().entries == 4
        cache.check_integrity()


def test_promotion_from_disk_into_dram(tmp_path: Path) -> None:
    tokens = list(range(8))
    with make(tmp_path) as cache:
        cache.store(tokens, kv_for(tokens))
        cache.flush()
        cpu_tier = cache.tiers[0]
        for k in cache.chunk_keys(tokens):
            cpu_tier.remove(k)
        outs = [torch.empty(LAYERS, 2, C, HEADS, DIM, dtype=torch.float16) for _ in range(2)]
        assert cache.get_chunks_into(cache.chunk_keys(tokens), outs) == 2
        assert torch.equal(torch.cat(outs, dim=2), kv_for(tokens))
        assert cpu_tier.contains_many(cache.chunk_keys(tokens)) == [True, True]


def test_promote_on_hit_can_be_disabled(tmp_path: Path) -> None:
    tokens = list(range(8))
    with make(tmp_path, promote_on_hit=False) as cache:
        cache.store(tokens, kv_for(tokens))
        cache.flush()
        for k in cache.chunk_keys(tokens):
            cache.tiers[0].remove(k)
        assert cache.retrieve(tokens)[1] == 8
        assert cache.tiers[0].stats().entries == 0


def test_selective_write_tiers(tmp_path: Path) -> None:
    tokens = list(range(8))
    with make(tmp_path, write_tiers=["file"]) as cache:
        cache.store(tokens, kv_for(tokens))
        cache.flush()
        assert cache.tiers[0].stats().entries == 0 and cache.tiers[1].stats().entries == 2
    with pytest.raises(ConfigError, match=r"unknown tiers \['disk'\]"):
        make(write_tiers=["disk"])


def test_admission_threshold_counts_requests_not_stores() -> None:
    tokens = list(range(8))
    with make(admission_threshold=2) as cache:
        assert cache.store(tokens, kv_for(tokens)) == 0  # never requested
        assert cache.lookup(tokens) == 0  # request 1
        assert cache.store(tokens, kv_for(tokens)) == 0  # a store is not a request
        assert cache.contains_prefix(cache.chunk_keys(tokens)) == 0  # no side effects
        assert cache.lookup(tokens) == 0  # request 2
        assert cache.store(tokens, kv_for(tokens)) == 8
        assert cache.stats().admission_rejected == 4
        cache.count_requests(cache.chunk_keys([50, 51, 52, 53]) * 2)
        assert cache.store([50, 51, 52, 53], kv_for([50, 51, 52, 53])) == 4


def test_namespaces_isolate_salts_adapters_and_models() -> None:
    tokens = list(range(8))
    with make() as cache:
        cache.store(tokens, kv_for(tokens), salt="tenant-a")
        assert cache.lookup(tokens, salt="tenant-a") == 8
        assert cache.lookup(tokens) == 0 and cache.lookup(tokens, salt="tenant-b") == 0
        cache.store(tokens, kv_for(tokens), adapter="sql@1")
        assert (
            cache.lookup(tokens, adapter="sql@1") == 8
            and cache.lookup(tokens, adapter="sql@2") == 0
        )
        other = KVCache(KVConfig(model="toy@2", chunk_size=C), tiers=cache.tiers)
        assert other.lookup(tokens, salt="tenant-a") == 0


def test_partial_chunks_when_enabled() -> None:
    tokens = list(range(10))
    with make(save_partial_chunks=True) as cache:
        assert cache.store(tokens, kv_for(tokens)) == 10
        assert cache.lookup(tokens) == 10
        got, n = cache.retrieve(tokens)
        assert n == 10 and got is not None and torch.equal(got, kv_for(tokens))
        assert cache.lookup([*tokens, 77]) == 8  # a longer prompt misses the partial chunk


@pytest.mark.parametrize(
    ("tokens", "kv", "problem"),
    [
        (list(range(8)), torch.zeros(2, 2, 8, 2), "must have shape"),
        (list(range(8)), torch.zeros(2, 3, 8, 2, 8), "must have shape"),
        (list(range(8)), torch.zeros(2, 2, 7, 2, 8, dtype=torch.float16), "holds 7 tokens but 8"),
        (list(range(8)), torch.zeros(2, 2, 8, 2, 8, dtype=torch.complex64), "unsupported KV dtype"),
        (list(range(8)), [[0.0]], "must be a torch.Tensor"),
        ([0.5] * 8, torch.zeros(2, 2, 8, 2, 8, dtype=torch.float16), "integers"),
        ([-1] * 8, torch.zeros(2, 2, 8, 2, 8, dtype=torch.float16), "out of range"),
    ],
)
def test_bad_input_raises_and_stores_nothing(tokens: Any, kv: Any, problem: str) -> None:
    with make() as cache, pytest.raises(ValueError, match=problem):
        cache.store(tokens, kv)
    assert cache.stats().by_tier["cpu"].entries == 0


def test_the_first_store_fixes_the_layout_unless_configured() -> None:
    tokens = list(range(8))
    with make() as cache:
        cache.store(tokens, kv_for(tokens))
        with pytest.raises(
            ValueError, match=r"kv dtype bfloat16 does not match the cache's float16"
        ):
            cache.store(tokens, kv_for(tokens).bfloat16())
        with pytest.raises(ValueError, match=r"\(2, 4, 8\) does not match the cache's \(2, 2, 8\)"):
            cache.store(tokens, torch.zeros(2, 2, 8, 4, 8, dtype=torch.float16))
    shape = {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128}
    with (
        make(kv_dtype="bfloat16", model_shape=shape) as cache,
        pytest.raises(ValueError, match="float16"),
    ):
        cache.store(tokens, kv_for(tokens))


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"chunk_size": -4}, "chunk_size"),
        ({"tiers": ["cpu://?size=-1"]}, "not a size"),
        ({"tiers": ["memcached://host"]}, "unknown tier scheme 'memcached'"),
        ({"tiers": []}, "at least one tier"),
        ({"kv_dtype": "bf16"}, "unsupported KV dtype 'bf16'"),
        ({"tp_rank": 2, "tp_size": 2}, "tp_rank 2 is out of range"),
        ({"admission_threshold": 0}, "admission_threshold"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_config_is_a_config_error(config: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        KVCache.from_config({"model": "m", **config})


class FailingTier(Tier):
    """Raises on every call, like a remote tier whose server is gone."""

    scheme = "failing"

    def __init__(self) -> None:
        super().__init__("failing")

    def _fail(self, *args: Any) -> Any:
        raise TierError("connection refused")

    contains = get = get_into = put = remove = _fail
    contains_many = get_many_into = put_many = _fail

    def stats(self) -> Any:
        from kvstack.kv.tiers import TierStats

        return TierStats(self.name)


@pytest.mark.parametrize("position", [0, 1])
def test_a_failing_tier_degrades_to_a_miss(position: int) -> None:
    tiers: list[Tier] = [CPUTier(1 << 20)]
    tiers.insert(position, FailingTier())
    cache = KVCache(KVConfig(model="m", chunk_size=C), tiers=tiers)
    tokens = list(range(12))
    assert cache.store(tokens, kv_for(tokens)) == 12  # the healthy tier holds it
    assert cache.lookup(tokens) == 12
    got, n = cache.retrieve(tokens)
    assert n == 12 and got is not None and torch.equal(got, kv_for(tokens))
    outs = [torch.empty(LAYERS, 2, C, HEADS, DIM, dtype=torch.float16) for _ in range(3)]
    assert cache.get_chunks_into(cache.chunk_keys(tokens), outs) == 3
    assert cache.stats().tier_errors > 0
    only_failing = KVCache(KVConfig(model="m", chunk_size=C), tiers=[FailingTier()])
    assert only_failing.store(tokens, kv_for(tokens)) == 0
    assert only_failing.lookup(tokens) == 0 and only_failing.retrieve(tokens) == (None, 0)


def test_two_phase_put_writes_through(tmp_path: Path) -> None:
    tokens = list(range(4))
    with make(tmp_path) as cache:
        (key,) = cache.chunk_keys(tokens)
        buf = cache.prepare_put(key, torch.float16, (LAYERS, 2, C, HEADS, DIM))
        assert buf is not None
        buf.copy_(kv_for(tokens))
        assert cache.complete_put(key)
        cache.flush()
        assert all(t.contains(key) for t in cache.tiers)
        got, n = cache.retrieve(tokens)
        assert n == 4 and got is not None and torch.equal(got, kv_for(tokens))
        assert cache.prepare_put(key, torch.float16, (LAYERS, 2, C, HEADS, DIM)) is None
        cache.check_integrity()


def test_listeners_see_tier_events(tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    with make(tmp_path) as cache:
        cache.add_listener(lambda e: events.append((e.kind, e.tier)))
        cache.add_listener(lambda e: 1 / 0)  # a broken listener changes nothing
        cache.store(list(range(4)), kv_for(list(range(4))))
        cache.flush()
    assert sorted(events) == [("stored", "cpu"), ("stored", "file")]


def test_concurrent_store_and_retrieve(tmp_path: Path) -> None:
    prompts = [[p] * 3 + list(range(p, p + 17)) for p in range(6)]  # 5 chunks each
    errors: list[str] = []
    with make(tmp_path, tiers=[f"cpu://?size={12 * CHUNK_BYTES}"]) as cache:

        def worker(seed: int) -> None:
            for round_ in range(15):
                tokens = prompts[(seed + round_) % len(prompts)]
                cache.store(tokens, kv_for(tokens))
                got, n = cache.retrieve(prompts[(seed * 7 + round_) % len(prompts)])
                want = kv_for(prompts[(seed * 7 + round_) % len(prompts)])
                if got is not None and not torch.equal(got, want[:, :, :n]):
                    errors.append(f"wrong KV for prompt in round {round_}")

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        cache.check_integrity()


def test_close_is_idempotent_and_flushes(tmp_path: Path) -> None:
    cache = make(tmp_path)
    cache.store(list(range(8)), kv_for(list(range(8))))
    cache.close()
    cache.close()
    again = make(tmp_path)
    assert again.lookup(list(range(8))) == 8  # from disk
    again.close()


def test_chunk_level_argument_checks() -> None:
    with make() as cache:
        with pytest.raises(ValueError, match="2 keys but 1 chunks"):
            cache.put_chunks([ChunkKey(bytes(16))] * 2, [torch.zeros(1)])
        with pytest.raises(ValueError, match="1 keys but 0 output buffers"):
            cache.get_chunks_into([ChunkKey(bytes(16))], [])


def test_events_carry_tier_names() -> None:
    seen: list[TierEvent] = []
    with make(tiers=["cpu://?size=1MiB", "cpu://?size=1MiB"]) as cache:
        assert [t.name for t in cache.tiers] == ["cpu", "cpu1"]
        cache.add_listener(seen.append)
        cache.store(list(range(4)), kv_for(list(range(4))))
    assert {e.tier for e in seen} == {"cpu", "cpu1"}


def test_from_config_reads_the_security_section_and_bounds_reads_by_the_layout(
    tmp_path: Path,
) -> None:
    from kvstack.kv.format import MAX_CHUNK_BYTES
    from kvstack.security import write_secret_file

    secret = write_secret_file(tmp_path / "cluster-secret")
    config = {"model": "m", "chunk_size": 16, "tiers": [f"file://{tmp_path}/kv?size=4MiB"]}
    with KVCache.from_config(config, security={"cluster_secret_file": str(secret)}) as cache:
        assert cache.trust.sealed and cache.tiers[0].trust is cache.trust
        assert cache.trust.max_chunk_bytes == MAX_CHUNK_BYTES  # no layout known yet
        cache.store(list(range(32)), torch.zeros(3, 2, 32, 2, 8, dtype=torch.float16))
        assert cache.trust.max_chunk_bytes == 3 * 2 * 16 * 2 * 8 * 2  # one chunk of it
    with KVCache.from_config(config) as plain:
        assert not plain.trust.sealed
