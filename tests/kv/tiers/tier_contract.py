"""The contract every :class:`~kvstack.kv.tiers.Tier` keeps (see ``kvstack/kv/tiers/base.py``).

``TierContract`` is a mixin of tests over a ``tier`` fixture (a fresh, empty tier of at least
16 MiB, closed afterwards). ``tests/kv/tiers/test_tier_contract.py`` runs it over every factory in
``tests/kv/tiers/conftest.py``; a test module elsewhere can also subclass it with its own fixture.
"""

from __future__ import annotations

import threading

import pytest
import torch

from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers import Tier, TierEvent

SHAPE = (2, 2, 16, 2, 8)  # [layers, 2, tokens, kv heads, head dim]


def key(i: int) -> ChunkKey:
    return ChunkKey(i.to_bytes(4, "little") * 4)


def chunk(
    i: int, dtype: torch.dtype = torch.float16, shape: tuple[int, ...] = SHAPE
) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    return torch.randn(shape, generator=g).to(dtype)


def stored(tier: Tier, k: ChunkKey, c: torch.Tensor) -> None:
    assert tier.put(k, c)
    assert tier.flush(timeout_s=30)


class TierContract:
    def test_a_miss_is_a_return_value(self, tier: Tier) -> None:
        assert not tier.contains(key(1))
        assert tier.get(key(1)) is None
        assert not tier.get_into(key(1), torch.empty(SHAPE, dtype=torch.float16))
        assert not tier.remove(key(1))
        assert tier.stats().misses >= 2

    def test_round_trip_for_each_dtype(self, tier: Tier) -> None:
        for i, dtype in enumerate([torch.float16, torch.bfloat16, torch.float32, torch.uint8]):
            c = chunk(i) if dtype != torch.uint8 else torch.arange(640, dtype=torch.uint8)
            c = c.to(dtype) if dtype != torch.uint8 else c
            stored(tier, key(i), c)
            assert tier.contains(key(i))
            got = tier.get(key(i))
            assert got is not None and got.dtype == dtype and torch.equal(got, c)
            out = torch.empty_like(c)
            assert tier.get_into(key(i), out) and torch.equal(out, c)

    def test_get_into_a_strided_view(self, tier: Tier) -> None:
        stored(tier, key(1), chunk(1))
        big = torch.zeros(2, 2, 48, 2, 8, dtype=torch.float16)
        view = big[:, :, 16:32]
        assert not view.is_contiguous()
        assert tier.get_into(key(1), view)
        assert torch.equal(big[:, :, 16:32], chunk(1))
        assert not big[:, :, :16].any() and not big[:, :, 32:].any()

    def test_layout_mismatch_is_a_miss(self, tier: Tier) -> None:
        stored(tier, key(1), chunk(1))
        assert not tier.get_into(key(1), torch.empty(SHAPE, dtype=torch.bfloat16))
        assert not tier.get_into(key(1), torch.empty((2, 2, 8, 2, 8), dtype=torch.float16))
        out = torch.empty(SHAPE, dtype=torch.float16)
        assert tier.get_into(key(1), out) and torch.equal(out, chunk(1))  # still there

    def test_put_accepts_strided_chunks_and_is_idempotent(self, tier: Tier) -> None:
        source = chunk(7, shape=(2, 2, 32, 2, 8))
        view = source[:, :, 8:24]
        stored(tier, key(1), view)
        stored(tier, key(1), chunk(99))  # already present: kept as it was
        got = tier.get(key(1))
        assert got is not None and torch.equal(got, view)

    def test_stored_chunk_is_independent_of_the_caller_after_flush(self, tier: Tier) -> None:
        c = chunk(3)
        expected = c.clone()
        stored(tier, key(1), c)
        c.fill_(0)  # allowed once written (or right after put for put_copies tiers)
        got = tier.get(key(1))
        assert got is not None and torch.equal(got, expected)

    def test_remove(self, tier: Tier) -> None:
        stored(tier, key(1), chunk(1))
        assert tier.remove(key(1))
        assert not tier.contains(key(1)) and tier.get(key(1)) is None
        assert not tier.remove(key(1))
        stored(tier, key(1), chunk(2))  # a removed key can be stored again
        got = tier.get(key(1))
        assert got is not None and torch.equal(got, chunk(2))

    def test_keys_lists_what_is_stored_for_a_full_sync(self, tier: Tier) -> None:
        if not hasattr(tier, "keys"):
            pytest.skip(f"{type(tier).__name__} cannot list its keys")
        for i in range(3):
            assert tier.put(key(i), chunk(i))
        tier.flush()
        assert tier.remove(key(1))
        tier.flush()
        assert set(tier.keys()) == {key(0), key(2)}

    def test_a_chunk_is_readable_right_after_put(self, tier: Tier) -> None:
        assert tier.put(key(1), chunk(1))  # no flush: it may still be in a write queue
        assert tier.contains(key(1))
        out = torch.empty(SHAPE, dtype=torch.float16)
        assert tier.get_into(key(1), out) and torch.equal(out, chunk(1))

    def test_remove_right_after_put_wins(self, tier: Tier) -> None:
        assert tier.put(key(1), chunk(1))
        tier.remove(key(1))  # may cancel a queued write
        assert tier.flush(timeout_s=30)
        assert not tier.contains(key(1)) and tier.get(key(1)) is None

    def test_batched_forms_agree_with_single_ones(self, tier: Tier) -> None:
        keys = [key(i) for i in range(6)]
        assert all(tier.put_many(keys[:4], [chunk(i) for i in range(4)]))
        assert tier.flush(timeout_s=30)
        assert tier.contains_many(keys) == [True] * 4 + [False] * 2
        outs = [torch.empty(SHAPE, dtype=torch.float16) for _ in keys]
        assert tier.get_many_into(keys, outs) == [True] * 4 + [False] * 2
        assert all(torch.equal(outs[i], chunk(i)) for i in range(4))

    def test_listeners_hear_stores_and_removals(self, tier: Tier) -> None:
        events: list[TierEvent] = []
        tier.add_listener(events.append)
        stored(tier, key(1), chunk(1))
        tier.remove(key(1))
        kinds = [(e.kind, e.key, e.tier) for e in events]
        assert kinds == [("stored", key(1), tier.name), ("removed", key(1), tier.name)]
        assert events[1].reason == "removed"

    def test_stats_count_operations(self, tier: Tier) -> None:
        stored(tier, key(1), chunk(1))
        tier.get(key(1))
        tier.get(key(2))
        s = tier.stats()
        assert (s.name, s.entries, s.hits, s.misses) == (tier.name, 1, 1, 1)
        assert s.bytes_written >= chunk(1).numel() * 2 * 0.5 and s.bytes_read > 0
        assert 0 < s.bytes_used <= s.capacity_bytes

    def test_concurrent_puts_and_gets_never_return_wrong_data(self, tier: Tier) -> None:
        errors: list[str] = []

        def worker(offset: int) -> None:
            for i in range(offset, offset + 12):
                tier.put(key(i % 16), chunk(i % 16))
                out = torch.empty(SHAPE, dtype=torch.float16)
                j = (i * 5) % 16
                if tier.get_into(key(j), out) and not torch.equal(out, chunk(j)):
                    errors.append(f"wrong data for key {j}")

        threads = [threading.Thread(target=worker, args=(n * 4,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        tier.flush(timeout_s=30)
        tier.check_integrity()

    def test_close_is_idempotent(self, tier: Tier) -> None:
        stored(tier, key(1), chunk(1))
        tier.close()
        tier.close()
