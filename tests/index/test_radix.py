"""RadixIndex as short narratives over tiny token ids (page size 2 unless said)."""

from __future__ import annotations

import pytest

from kvstack.index.radix import Owner, OwnerPolicy, Position, RadixIndex, RadixNamespace

NS = RadixNamespace("m")
A, B = Owner("a"), Owner("b")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tree(page_size: int = 2, **kw: object) -> tuple[RadixIndex, Clock]:
    clock = Clock()
    return RadixIndex(page_size=page_size, clock=clock, **kw), clock  # type: ignore[arg-type]


def test_match_is_page_granular_and_per_owner() -> None:
    t, _ = tree()
    t.insert(NS, [1, 2, 3, 4, 5], A)  # the partial last page is not stored
    t.insert(NS, [1, 2, 3, 9], B)
    m = t.match(NS, [1, 2, 3, 4, 5, 6])
    assert m.tokens(A) == 4 and m.tokens(B) == 2 and m.num_tokens == 6
    assert t.match(NS, [1, 2, 3, 9]).matched == {A: 2, B: 4}
    assert t.match(NS, [7, 7]).matched == {}
    assert t.num_tokens == 6  # [1,2] shared, [3,4] and [3,9] apart
    t.check_integrity()


def test_namespaces_never_share_nodes() -> None:
    t, _ = tree()
    t.insert(NS, [1, 2, 3, 4], A)
    for other in (
        RadixNamespace("m", adapter="x"),
        RadixNamespace("m", salt="s"),
        RadixNamespace("n"),
    ):
        assert t.match(other, [1, 2, 3, 4]).matched == {}
    t.insert(RadixNamespace("m", adapter="x"), [1, 2], B)
    assert t.match(NS, [1, 2]).matched == {A: 2}
    assert t.num_tokens == 6
    t.check_integrity()


def test_remove_cuts_the_owner_from_a_page_on_and_keeps_others() -> None:
    t, _ = tree()
    t.insert(NS, [1, 2, 3, 4, 5, 6], A)
    t.insert(NS, [1, 2, 3, 4, 5, 6], B)
    assert t.remove(NS, [1, 2, 3, 4, 5, 6], A, start=2) == 4
    assert t.match(NS, [1, 2, 3, 4, 5, 6]).matched == {A: 2, B: 6}
    assert t.remove(NS, [1, 2, 3, 4], A, start=3) == 0  # A no longer holds [3, 4]
    assert t.remove(NS, [1, 2, 7, 7], B, start=2) == 0  # another path
    t.check_integrity()
    t.drop_owner(B)
    assert t.match(NS, [1, 2, 3, 4, 5, 6]).matched == {A: 2}
    assert t.num_tokens == 2
    t.check_integrity()


def test_capacity_evicts_the_least_recently_used_tail_page_exact() -> None:
    t, clock = tree()
    t.set_policy(A, OwnerPolicy(capacity_tokens=8))
    t.insert(NS, [1, 2, 3, 4, 5, 6], A)
    clock.now = 1
    t.insert(NS, [9, 9, 8, 8], A)  # 10 tokens: the oldest tail page goes
    assert t.owned_tokens(A) == 8
    assert t.match(NS, [1, 2, 3, 4, 5, 6]).tokens(A) == 4
    clock.now = 2
    t.insert(NS, [1, 2], A)  # touching [1,2] makes it newer than [9,9,8,8]
    t.insert(NS, [7, 7, 7, 7], A)  # 4 over: [3,4] (time 0) goes, then the tail [8,8]
    assert t.match(NS, [1, 2, 3, 4]).tokens(A) == 2
    assert t.match(NS, [9, 9, 8, 8]).tokens(A) == 2
    t.check_integrity()


def test_locked_paths_survive_eviction_until_unlocked() -> None:
    t, clock = tree()
    t.set_policy(A, OwnerPolicy(capacity_tokens=4))
    held = t.insert(NS, [1, 2, 3, 4], A, lock=True)
    clock.now = 1
    t.insert(NS, [5, 6, 7, 8], A)  # over capacity, but [1..4] is pinned: the new one goes
    assert t.match(NS, [1, 2, 3, 4]).tokens(A) == 4
    assert t.match(NS, [5, 6, 7, 8]).tokens(A) == 0
    t.check_integrity()
    second = t.insert(NS, [5, 6, 7, 8], A, lock=True)
    assert t.owned_tokens(A) == 8  # both pinned: over capacity for now
    t.check_integrity()
    t.unlock(held.lock, A)  # the older path goes as soon as it is released
    assert t.owned_tokens(A) == 4 and t.match(NS, [5, 6, 7, 8]).tokens(A) == 4
    t.unlock(second.lock, A)
    t.check_integrity()


def test_ttl_forgets_entries_not_touched_in_time() -> None:
    t, clock = tree()
    t.set_policy(A, OwnerPolicy(ttl_s=10))
    t.insert(NS, [1, 2, 3, 4], A)
    clock.now = 5
    t.insert(NS, [1, 2, 5, 6], A)
    clock.now = 12
    assert t.expire() == 2  # [3,4] is 12 s old; [1,2] and [5,6] were touched at 5
    assert t.match(NS, [1, 2, 5, 6]).tokens(A) == 4
    clock.now = 20
    t.expire()
    assert t.num_tokens == 0 and t.num_nodes == 0
    t.check_integrity()


def test_total_bound_evicts_the_globally_oldest() -> None:
    t, clock = tree(max_tokens=6)
    t.insert(NS, [1, 2, 3, 4], A)
    clock.now = 1
    t.insert(NS, [5, 6, 7, 8], B)
    assert t.num_tokens <= 6
    assert t.match(NS, [5, 6, 7, 8]).tokens(B) == 4
    assert t.match(NS, [1, 2, 3, 4]).tokens(A) == 2
    t.check_integrity()


def test_a_leaf_held_by_one_owner_grows_in_place() -> None:
    t, _ = tree()
    t.insert(NS, [1, 2], A)
    t.insert(NS, [1, 2, 3, 4], A)
    t.insert(NS, [1, 2, 3, 4, 5, 6], A)
    assert t.num_nodes == 1 and t.owned_tokens(A) == 6
    t.insert(NS, [1, 2, 3, 4, 5, 6, 7, 8], B)
    assert t.num_nodes == 2
    assert t.match(NS, [1, 2, 3, 4, 5, 6, 7, 8]).matched == {A: 6, B: 8}
    t.check_integrity()


def test_bad_arguments_name_the_problem() -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixIndex(page_size=0)
    with pytest.raises(ValueError, match="capacity_tokens"):
        OwnerPolicy(capacity_tokens=-1)
    with pytest.raises(ValueError, match="ttl_s"):
        OwnerPolicy(ttl_s=0)


def test_positions_follow_splits_and_die_with_their_node() -> None:
    t, _ = tree()
    first = t.insert(NS, [1, 2, 3, 4], A)  # block 0: [1,2], block 1: [3,4]
    assert first.end is not None and first.depth == 4
    t.insert(NS, [1, 2, 9, 9], B)  # splits [1,2,3,4]: the anchor node keeps [3,4]
    more = t.insert_at(Position(first.end, 4), [5, 6], A)  # a child block of [3,4]
    assert more is not None and t.match(NS, [1, 2, 3, 4, 5, 6]).tokens(A) == 6
    assert t.remove_at(Position(first.end, 2), A) == 4  # lost [3,4] and [5,6]
    assert t.match(NS, [1, 2, 3, 4, 5, 6]).tokens(A) == 2
    assert t.insert_at(Position(first.end, 4), [5, 6], A) is None  # its node was deleted
    assert t.remove_at(Position(first.end, 2), A) is None
    t.check_integrity()
