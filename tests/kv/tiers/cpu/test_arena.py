"""The CPU tier's arena: recycled extents, coalescing, exact accounting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstack.kv.tiers.cpu.arena import ALIGN, Arena, extent_bytes


def test_extents_are_recycled_and_coalesced() -> None:
    arena = Arena(4096)
    a, b, c = (arena.alloc(1000) for _ in range(3))
    assert (a, b, c) == (0, 1024, 2048) and arena.alloc(2000) is None
    arena.free(b, 1000)  # type: ignore[arg-type]
    assert arena.alloc(1000) == b  # same size: reused at once
    arena.free(a, 1000)  # type: ignore[arg-type]
    arena.free(b, 1000)  # type: ignore[arg-type]
    assert arena.alloc(2000) == 0  # two neighbours merged
    arena.check(extent_bytes(2000) + extent_bytes(1000))


def test_views_share_memory_and_owned_views_outlive_release() -> None:
    arena = Arena(1024)
    offset = arena.alloc(64)
    assert offset is not None
    arena.view(offset, 64).fill_(7)
    owned, holder = arena.owned_view(offset, 64)
    arena.release()
    assert owned.tolist() == [7] * 64 and holder is not None


def test_empty_extents_take_space() -> None:
    assert extent_bytes(0) == ALIGN and extent_bytes(1) == ALIGN and extent_bytes(65) == 2 * ALIGN


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3000)), max_size=80))
def test_random_alloc_free_keeps_accounting(ops: list[tuple[bool, int]]) -> None:
    arena = Arena(16384)
    held: list[tuple[int, int]] = []
    for do_alloc, size in ops:
        if do_alloc or not held:
            offset = arena.alloc(size)
            if offset is not None:
                assert all(
                    offset + extent_bytes(size) <= o or o + extent_bytes(s) <= offset
                    for o, s in held
                )
                held.append((offset, size))
        else:
            offset, size = held.pop(size % len(held))
            arena.free(offset, size)
        arena.check(sum(extent_bytes(s) for _, s in held))
