"""Eviction policies: orders, pins, and S3-FIFO's resistance to scans."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstack.errors import ConfigError
from kvstack.kv.policy import POLICIES, EvictionPolicy, make_policy


def drain(policy: EvictionPolicy, pinned: frozenset[Hashable] = frozenset()) -> list[Hashable]:
    out = []
    while (victim := policy.evict(lambda k: k not in pinned)) is not None:
        out.append(victim)
    return out


def test_lru_evicts_least_recently_used() -> None:
    p = make_policy("lru")
    for k in "abcd":
        p.on_insert(k)
    p.on_access("a")
    p.on_access("c")
    assert drain(p) == ["b", "d", "a", "c"]


def test_fifo_ignores_accesses() -> None:
    p = make_policy("fifo")
    for k in "abcd":
        p.on_insert(k)
    p.on_access("a")
    assert drain(p) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("name", POLICIES.names())
def test_pinned_keys_are_skipped_and_none_when_all_pinned(name: str) -> None:
    p = make_policy(name)
    for k in range(10):
        p.on_insert(k)
    victims = drain(p, pinned=frozenset({0, 3, 7}))
    assert sorted(victims) == [1, 2, 4, 5, 6, 8, 9]
    assert p.keys() == {0, 3, 7}
    assert p.evict(lambda k: False) is None and p.keys() == {0, 3, 7}


@pytest.mark.parametrize("name", POLICIES.names())
def test_removed_keys_are_forgotten(name: str) -> None:
    p = make_policy(name)
    for k in range(5):
        p.on_insert(k)
    p.on_remove(2)
    p.on_remove(42)  # unknown: no-op
    assert sorted(drain(p)) == [0, 1, 3, 4]


def _survivors(name: str) -> set[int]:
    """A hot set of 20 keys (each read often), then a scan of 200 one-hit keys, with room
    for 40 entries; which hot keys survive?"""
    p = make_policy(name)
    held: set[int] = set()

    def insert(k: int) -> None:
        if len(held) >= 40:
            victim = p.evict(lambda _k: True)
            held.discard(victim)  # type: ignore[arg-type]
        p.on_insert(k)
        held.add(k)

    for k in range(20):
        insert(k)
    for _ in range(3):
        for k in range(20):
            p.on_access(k)
    for k in range(1000, 1200):  # the scan
        insert(k)
    return held & set(range(20))


def test_s3fifo_keeps_the_working_set_through_a_scan_and_lru_does_not() -> None:
    assert _survivors("s3fifo") == set(range(20))
    assert _survivors("lru") == set()
    assert _survivors("fifo") == set()


def test_s3fifo_ghost_hits_go_to_main() -> None:
    p = make_policy("s3fifo")
    for k in range(20):
        p.on_insert(k)
    first = p.evict(lambda _k: True)
    p.on_insert(first)  # evicted recently and wanted again: admitted to the main queue
    victims = drain(p)
    assert victims[-1] == first


def test_unknown_policy_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match="unknown eviction policy 'lfu'; known: fifo, lru, s3fifo"
    ):
        make_policy("lfu")


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(POLICIES.names()),
    ops=st.lists(st.tuples(st.sampled_from("iare"), st.integers(0, 15)), max_size=120),
)
def test_policies_track_exactly_the_live_keys(name: str, ops: list[tuple[str, int]]) -> None:
    p = make_policy(name)
    live: set[int] = set()
    for op, k in ops:
        if op == "i" and k not in live:
            p.on_insert(k)
            live.add(k)
        elif op == "a":
            p.on_access(k)
        elif op == "r":
            p.on_remove(k)
            live.discard(k)
        elif op == "e":
            victim = p.evict(lambda key: key % 3 != 0)
            assert victim is None or (victim in live and victim % 3 != 0)  # type: ignore[operator]
            live.discard(victim)  # type: ignore[arg-type]
        assert p.keys() == live
