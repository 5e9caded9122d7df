"""The CPU tier: byte budget, eviction with demotion offers, leases (pinning), two-phase puts."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from kvstack.errors import ConfigError
from kvstack.kv.tiers import TierEvent, make_tier
from kvstack.kv.tiers.cpu.tier import CPUTier
from tests.kv.tiers.tier_contract import chunk, key

CHUNK_BYTES = 2 * 2 * 16 * 2 * 8 * 2  # SHAPE in float16 = 2 KiB


def full_tier(num_chunks: int = 4, policy: str = "lru") -> CPUTier:
    tier = CPUTier(num_chunks * CHUNK_BYTES, policy)
    for i in range(num_chunks):
        assert tier.put(key(i), chunk(i))
    return tier


def test_budget_is_kept_and_lru_victims_go_first() -> None:
    tier = full_tier()
    tier.get(key(0))  # recently used: survives
    assert tier.put(key(10), chunk(10))
    assert not tier.contains(key(1)) and tier.contains(key(0)) and tier.contains(key(10))
    s = tier.stats()
    assert (s.entries, s.evictions, s.bytes_used) == (4, 1, 4 * CHUNK_BYTES)
    tier.check_integrity()


def test_eviction_offers_the_chunk_then_reuses_memory() -> None:
    tier = full_tier()
    offered: list[TierEvent] = []

    def listener(event: TierEvent) -> None:
        if event.kind == "removed":
            assert event.chunk is not None
            offered.append(event._replace(chunk=event.chunk.clone()))

    tier.add_listener(listener)
    for i in range(10, 14):
        assert tier.put(key(i), chunk(i))
    assert [e.key for e in offered] == [key(i) for i in range(4)]
    assert all(torch.equal(e.chunk, chunk(i)) for i, e in enumerate(offered))  # type: ignore[arg-type]
    assert all(e.reason == "evicted" for e in offered)
    tier.check_integrity()


def test_a_listener_that_keeps_evicted_chunks_makes_puts_fail_soft() -> None:
    tier = full_tier()
    kept: list[TierEvent] = []
    tier.add_listener(kept.append)  # misbehaves: keeps the chunks
    assert tier.put(key(10), chunk(10)) is False  # its victim's memory is still held
    assert tier.stats().dropped_writes == 1
    kept.clear()
    gc.collect()
    assert tier.put(key(11), chunk(11))
    tier.check_integrity()


def test_leased_entries_are_pinned_until_every_view_is_gone() -> None:
    tier = full_tier()
    got = tier.get(key(0))
    assert got is not None
    part = got[1, 0]  # a view of the returned tensor keeps the lease
    del got
    for i in range(10, 20):  # churn: everything else is evicted, key(0) never
        assert tier.put(key(i), chunk(i))
    assert tier.contains(key(0)) and torch.equal(part, chunk(0)[1, 0])
    del part
    gc.collect()
    for i in range(20, 24):
        assert tier.put(key(i), chunk(i))
    assert not tier.contains(key(0))
    tier.check_integrity()


def test_removing_a_leased_entry_frees_its_memory_when_released() -> None:
    tier = full_tier()
    got = tier.get(key(0))
    assert tier.remove(key(0)) and not tier.contains(key(0))
    assert got is not None and torch.equal(got, chunk(0))  # still readable
    assert tier.stats().extra["leased_removed_bytes"] == CHUNK_BYTES
    tier.check_integrity()
    del got
    gc.collect()
    assert tier.stats().extra["leased_removed_bytes"] == 0
    assert tier.stats().bytes_used == 3 * CHUNK_BYTES
    tier.check_integrity()


def test_put_fails_soft_when_everything_is_leased() -> None:
    tier = full_tier(2)
    leases = [tier.get(key(0)), tier.get(key(1))]
    assert tier.put(key(5), chunk(5)) is False
    assert tier.contains(key(0)) and tier.contains(key(1))
    del leases
    gc.collect()
    assert tier.put(key(5), chunk(5))
    tier.check_integrity()


def test_a_chunk_larger_than_the_tier_is_refused_without_evicting() -> None:
    tier = full_tier(2)
    assert tier.put(key(9), chunk(9, shape=(6, 2, 16, 2, 8))) is False
    assert tier.stats().entries == 2 and tier.stats().evictions == 0


def test_two_phase_put() -> None:
    tier = CPUTier(4 * CHUNK_BYTES)
    events: list[TierEvent] = []
    tier.add_listener(events.append)
    buf = tier.prepare_put(key(1), torch.float16, (2, 2, 16, 2, 8))
    assert buf is not None and not tier.contains(key(1))
    assert tier.prepare_put(key(1), torch.float16, (2, 2, 16, 2, 8)) is None  # in progress
    buf.copy_(chunk(1))
    assert tier.complete_put(key(1), ok=True) and tier.contains(key(1))
    assert [e.kind for e in events] == ["stored"]
    got = tier.get(key(1))
    assert got is not None and torch.equal(got, chunk(1))
    abandoned = tier.prepare_put(key(2), torch.float16, (2, 2, 16, 2, 8))
    assert abandoned is not None
    assert not tier.complete_put(key(2), ok=False) and not tier.contains(key(2))
    assert not tier.complete_put(key(3), ok=True)  # never prepared
    del got
    tier.check_integrity()
    assert tier.stats().bytes_used == CHUNK_BYTES


def test_s3fifo_tier_survives_a_scan() -> None:
    tier = full_tier(8, "s3fifo")
    for _ in range(2):
        for i in range(6):
            tier.get(key(i))
    for i in range(100, 140):  # one-hit scan
        tier.put(key(i), chunk(i))
    assert all(tier.contains(key(i)) for i in range(6))
    tier.check_integrity()


def test_closed_tier_refuses_puts() -> None:
    tier = full_tier(2)
    tier.close()
    assert tier.put(key(7), chunk(7)) is False and not tier.contains(key(0))


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("cpu://?size=-1GiB", "cpu tier size '-1GiB' is not a size"),
        ("cpu://?size=0", "cpu tier size must be > 0 bytes, got 0"),
        ("cpu://?size=1GiB&colour=red", "unknown parameter"),
        ("cpu://?policy=lfu", "unknown eviction policy 'lfu'"),
        ("cpu://?pin_memory=true", "needs CUDA"),
        ("cpu://?size=1GiB&size=2GiB", "given twice"),
    ],
)
def test_bad_urls_are_config_errors(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        make_tier(url)


def test_url_parameters() -> None:
    tier = make_tier("cpu://?size=3MiB&policy=fifo", name="hot")
    assert isinstance(tier, CPUTier) and tier.capacity_bytes == 3 << 20 and tier.name == "hot"


def test_first_puts_from_many_threads_land_in_one_arena() -> None:
    # The arena allocates its buffer on first use; two first puts racing to allocate it once
    # wrote into a buffer that was then replaced, and reads returned zeros.
    for _ in range(30):
        tier = CPUTier(64 << 20)  # large enough that allocating it takes a while
        barrier = threading.Barrier(4)

        def put(i: int, tier: CPUTier = tier, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            tier.put(key(i), chunk(i))

        threads = [threading.Thread(target=put, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(4):
            got = tier.get(key(i))
            assert got is not None and torch.equal(got, chunk(i)), f"chunk {i} lost"
        tier.close()
