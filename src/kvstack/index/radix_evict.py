"""Eviction for the radix tree: per-owner capacity (LRU leaves first, page-exact), TTL, and the
bound on the whole tree. Nodes an owner has locked are skipped and kept in its LRU."""

from __future__ import annotations

from collections.abc import Callable

from kvstack.index.radix_node import HeapEntry, OwnerState
from kvstack.index.radix_tree import TreeCore

__all__ = ["enforce_owner", "enforce_total", "expire_owner"]


def enforce_owner(tree: TreeCore, state: OwnerState, now: float) -> int:
    """Apply ``state``'s TTL and capacity; returns the tokens it lost."""
    lost = 0
    ttl_s = state.policy.ttl_s
    if ttl_s is not None:
        lost += expire_owner(tree, state, now - ttl_s)
    capacity = state.policy.capacity_tokens
    if capacity is not None and state.tokens > capacity:
        before = state.tokens
        _evict(tree, state, lambda: state.tokens - capacity)
        lost += before - state.tokens
    return lost


def enforce_total(tree: TreeCore, states: list[OwnerState]) -> None:
    """Evict the globally oldest owner entries until the tree is within ``max_tokens``."""
    limit = tree.max_tokens
    while limit is not None and tree.num_tokens > limit:
        oldest = [(e[0], s) for s in states if (e := s.oldest()) is not None]
        if not oldest:
            return
        state = min(oldest, key=lambda pair: pair[0])[1]
        if not _evict(tree, state, lambda: tree.num_tokens - limit, once=True):
            return


def expire_owner(tree: TreeCore, state: OwnerState, cutoff: float) -> int:
    """Drop ``state``'s entries last touched before ``cutoff``."""
    lost, kept = 0, []
    while (entry := state.oldest()) is not None and entry[0] < cutoff:
        state.pop_oldest()
        if entry[3].locked(state.owner):
            kept.append(entry)
            continue
        lost += tree._drop_subtree(entry[3], state.owner)
    _restore(state, kept)
    return lost


def _evict(
    tree: TreeCore, state: OwnerState, excess: Callable[[], int], once: bool = False
) -> bool:
    """Evict ``state``'s oldest unlocked entries while ``excess() > 0``; True if any went."""
    kept: list[HeapEntry] = []
    evicted = False
    page = tree.page_size
    while excess() > 0 and (entry := state.pop_oldest()) is not None:
        node = entry[3]
        if node.locked(state.owner):
            kept.append(entry)
            continue
        keep = len(node.key) - -(-excess() // page) * page
        if keep > 0 and not any(state.owner in c.owners for c in node.children.values()):
            tree._split(node, keep)  # only the tail goes; the upper part keeps its place
        tree._drop_subtree(node, state.owner)
        evicted = True
        if once:
            break
    _restore(state, kept)
    return evicted


def _restore(state: OwnerState, entries: list[HeapEntry]) -> None:
    for entry in entries:
        state.touch(entry[3], entry[0])
