"""BlockPool: vLLM's free-queue LRU, shared cached blocks, duplicates; invariants hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstack.sim.blocks import BlockPool
from kvstack.sim.hashing import BlockHash


def h(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(32, "big"))


def test_cached_blocks_are_evicted_least_recently_freed_first() -> None:
    pool = BlockPool(4)
    a = pool.allocate(2)
    b = pool.allocate(2)
    assert a is not None and b is not None
    for i, block in enumerate(a + b):
        pool.cache(block, h(i))
    pool.free(a)  # freed tail first: a[1] then a[0]
    pool.free(b)
    assert pool.usage() == 0.0
    assert len(pool.match_prefix([h(0), h(1)])) == 2
    got = pool.allocate(1)
    assert got is not None
    assert pool.take_events() == [("removed", h(1))]  # a's last block went first
    assert len(pool.match_prefix([h(0), h(1)])) == 1
    pool.check_integrity()


def test_a_hit_takes_a_cached_block_out_of_the_free_queue() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.cache(blocks[0], h(7))
    pool.free(blocks)
    hits = pool.match_prefix([h(7)])
    assert pool.num_free_after_touch(hits) == 1
    pool.touch(hits)
    assert pool.allocate(2) is None  # only one left, nothing allocated
    assert pool.allocate(1) is not None
    assert pool.take_events() == []  # the free block held no hash
    pool.check_integrity()


def test_duplicate_copies_report_their_own_removal() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(2)
    assert blocks is not None
    for block in blocks:
        pool.cache(block, h(1))
    pool.free(blocks)
    assert pool.allocate(2) is not None
    assert pool.take_events() == [("removed", h(1)), ("removed", h(1))]
    assert pool.match_prefix([h(1)]) == []


def test_reset_needs_an_idle_pool() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.cache(blocks[0], h(3))
    assert not pool.reset()
    pool.free(blocks)
    assert pool.reset()
    assert pool.take_events() == [("cleared", None)]
    assert pool.match_prefix([h(3)]) == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["alloc", "free", "hit"]), st.integers(0, 7)), max_size=60)
)
def test_random_operations_keep_the_invariants(ops: list[tuple[str, int]]) -> None:
    pool = BlockPool(8)
    held: list[list] = []
    next_hash = 0
    for op, arg in ops:
        if op == "alloc":
            got = pool.allocate(arg % 4 + 1)
            if got is not None:
                for block in got:
                    pool.cache(block, h(next_hash % 5))  # collisions make duplicates
                    next_hash += 1
                held.append(got)
        elif op == "free" and held:
            pool.free(held.pop(arg % len(held)))
        elif op == "hit":
            hits = pool.match_prefix([h(arg % 5)])
            pool.touch(hits)
            if hits:
                held.append(hits)
        pool.check_integrity()
        assert pool.num_free == sum(1 for b in pool._blocks if b.ref_cnt == 0)
