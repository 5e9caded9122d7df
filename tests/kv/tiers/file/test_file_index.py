"""The file tier's index: reservations, eviction with deletion, adoption, commit vs removal."""

from __future__ import annotations

from kvstack.kv.tiers.file.file_index import FileIndex
from tests.kv.tiers.tier_contract import key

NO_DELETE = lambda _key: None  # noqa: E731 - a commit that is not cancelled deletes nothing


def test_reserve_evicts_in_policy_order_and_deletes_under_the_lock() -> None:
    index = FileIndex(300, "lru")
    for i in range(3):
        assert index.reserve(100, lambda k: None)[0]
        assert index.commit(key(i), 100, lambda: False, NO_DELETE)
    index.seen(key(0), 100)  # recently used
    deleted: list[bytes] = []
    fits, victims = index.reserve(150, deleted.append)
    assert fits and victims == deleted == [key(1), key(2)]
    assert index.usage() == (1, 250)
    index.release(150)
    index.check()


def test_a_reservation_larger_than_the_budget_fails_after_evicting_all() -> None:
    index = FileIndex(100, "lru")
    index.seen(key(0), 100)
    fits, victims = index.reserve(101, lambda k: None)
    assert not fits and victims == [key(0)] and index.usage() == (0, 0)


def test_adopt_probes_only_unknown_keys() -> None:
    index = FileIndex(1000, "fifo")
    probes: list[int] = []
    assert not index.adopt(key(1), lambda: probes.append(1) or None)
    assert index.adopt(key(1), lambda: 64) and index.adopt(key(1), lambda: probes.append(2) or None)
    assert probes == [1] and index.usage() == (1, 64)
    index.check()


def test_commit_after_cancel_releases_the_reservation() -> None:
    index = FileIndex(1000, "lru")
    assert index.reserve(100, lambda k: None)[0]
    deleted: list[bytes] = []
    assert not index.commit(key(1), 100, lambda: True, deleted.append)
    assert index.usage() == (0, 0) and deleted == [key(1)]
    assert index.reserve(100, lambda k: None)[0]
    index.seen(key(2), 100)  # adopted while being written: counted once
    assert index.commit(key(2), 100, lambda: False, NO_DELETE) and index.usage() == (1, 100)
    index.check()
    # Adopted while being written, then removed: the adoption goes with the file.
    assert index.reserve(100, lambda k: None)[0]
    index.seen(key(3), 100)
    assert not index.commit(key(3), 100, lambda: True, deleted.append)
    assert index.usage() == (1, 100) and deleted == [key(1), key(3)]
    index.check()
