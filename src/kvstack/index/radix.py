"""``RadixIndex``: which owners (backend, tier) hold which token prefixes, page by page.

A radix tree over token ids per :class:`RadixNamespace` (model, LoRA adapter and cache salt never
share nodes). Matching is page-granular: only whole pages of ``page_size`` tokens are stored
and matched, as an engine caches whole blocks. Each node carries the owners holding it, and
ownership is prefix-closed, so one walk down the tree gives every owner's matched length.

Protocol::

    index = RadixIndex(page_size=16)
    index.set_policy(Owner("a", "routed"), OwnerPolicy(capacity_tokens=..., ttl_s=...))
    match = index.match(ns, tokens)                      # no side effects
    match.tokens(Owner("a", "gpu"))                      # matched prefix length, in tokens
    done = index.insert(ns, tokens, owner, lock=True)    # now held by owner (LRU touched)
    index.unlock(done.lock, owner)                       # the request that pinned it ended
    index.remove(ns, tokens, owner, start=128)           # owner lost tokens[128:] (and beyond)
    # by position, for KV events that name a parent block instead of its tokens:
    more = index.insert_at(Position(done.end, 256), next_block_tokens, owner)
    index.remove_at(Position(more.end, 256), owner)      # lost everything from token 256 on
    index.drop_owner(owner)                              # owner lost everything
    index.expire()                                       # TTL sweep
    index.check_integrity()                              # raises AssertionError if broken

Eviction: an owner over its capacity loses its least recently used leaves first, page-exact
(the tail of a node is split off); nodes pinned by a lock are skipped. The whole tree is also
bounded by ``max_tokens``: past it, the globally oldest owner entries go. A node with no owner
left is deleted. Not thread-safe: the router uses it from its event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvstack.index.radix_check import check_integrity
from kvstack.index.radix_evict import enforce_owner, enforce_total
from kvstack.index.radix_node import Node, Owner, OwnerPolicy, RadixNamespace
from kvstack.index.radix_tree import Position, TreeCore
from kvstack.index.radix_walk import page_key

__all__ = [
    "InsertResult",
    "Owner",
    "OwnerPolicy",
    "Position",
    "PrefixMatch",
    "RadixIndex",
    "RadixNamespace",
]


class PrefixMatch(NamedTuple):
    num_tokens: int  # the query's length
    matched: dict[Owner, int]  # owner -> tokens matched from the start (owners with 0 absent)

    def tokens(self, owner: Owner) -> int:
        return self.matched.get(owner, 0)

    def best(self) -> int:
        return max(self.matched.values(), default=0)


class InsertResult(NamedTuple):
    new_tokens: int  # tokens the owner did not hold before
    end: Node | None  # the deepest node of the path: a Position anchor
    depth: int = 0  # tokens from the root to the end of the inserted path
    locked: bool = False

    @property
    def lock(self) -> Node | None:
        """The handle for :meth:`RadixIndex.unlock`: None unless the insert locked a path (an
        unlock of a path that was never locked would release other requests' locks on it)."""
        return self.end if self.locked else None


class RadixIndex(TreeCore):
    def __init__(
        self,
        page_size: int = 16,
        max_tokens: int | None = None,
        default_policy: OwnerPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(page_size, max_tokens, default_policy, clock)

    # -- owners ----------------------------------------------------------------------------
    def set_policy(self, owner: Owner, policy: OwnerPolicy) -> None:
        """Set ``owner``'s capacity and TTL (applied at once)."""
        state = self._state(owner)
        if state.policy != policy:
            state.policy = policy
            enforce_owner(self, state, self._clock())

    def owned_tokens(self, owner: Owner) -> int:
        state = self._owners.get(owner)
        return 0 if state is None else state.tokens

    def owners(self) -> list[Owner]:
        return [o for o, s in self._owners.items() if s.nodes]

    # -- queries ---------------------------------------------------------------------------
    def match(self, ns: RadixNamespace, tokens: Sequence[int]) -> PrefixMatch:
        """Every owner's matched prefix of ``tokens`` (whole pages). No side effects."""
        toks = tokens if isinstance(tokens, list) else list(tokens)
        matched: dict[Owner, int] = {}
        node = self._roots.get(ns)
        if node is None:
            return PrefixMatch(len(toks), matched)
        end = len(toks) - len(toks) % self.page_size
        pos = 0
        while pos < end:
            child = node.children.get(page_key(toks, pos, self.page_size))
            if child is None:
                break
            for owner in node.owners.keys() - child.owners.keys():
                matched[owner] = pos
            size = len(child.key)
            same = size if toks[pos : pos + size] == child.key else self._common(child, toks, pos)
            pos += same
            node = child
            if same < size:
                break
        for owner in node.owners:
            matched[owner] = pos
        return PrefixMatch(len(toks), matched)

    # -- updates ---------------------------------------------------------------------------
    def insert(
        self, ns: RadixNamespace, tokens: Sequence[int], owner: Owner, lock: bool = False
    ) -> InsertResult:
        """Record that ``owner`` holds every whole page of ``tokens``; touch its LRU entries.
        With ``lock``, pin the path for ``owner`` until :meth:`unlock`."""
        toks = tokens if isinstance(tokens, list) else list(tokens)
        end = len(toks) - len(toks) % self.page_size
        if end == 0:
            return InsertResult(0, None)
        path, grown = self._descend(self._root(ns), toks, end, owner)
        return self._finish_insert(path, owner, lock, grown)

    def insert_at(
        self, position: Position, tokens: Sequence[int], owner: Owner, lock: bool = False
    ) -> InsertResult | None:
        """Like :meth:`insert` for the path to ``position`` followed by ``tokens``; None when
        the position is gone (its node was deleted): re-insert from the root instead."""
        node = self._resolve(position, inside=False)
        if node is None or position.depth % self.page_size:
            return None
        node = self._split_at_depth(node, position.depth)
        toks = tokens if isinstance(tokens, list) else list(tokens)
        below, grown = self._descend(node, toks, len(toks) - len(toks) % self.page_size, owner)
        return self._finish_insert(self._ancestors(node) + below, owner, lock, grown)

    def _finish_insert(
        self, path: list[Node], owner: Owner, lock: bool, grown: int
    ) -> InsertResult:
        if not path:
            return InsertResult(0, None)
        new_tokens = self._own(path, owner, lock) + grown
        self._enforce(owner)
        enforce_total(self, list(self._owners.values()))
        end = path[-1]
        return InsertResult(new_tokens, end, end.depth, lock)

    def remove(
        self, ns: RadixNamespace, tokens: Sequence[int], owner: Owner, start: int = 0
    ) -> int:
        """``owner`` no longer holds ``tokens[start:]`` nor anything longer on that path
        (``start`` rounds down to a page; ``tokens`` must reach one page past it). Returns the
        tokens it lost."""
        toks = tokens if isinstance(tokens, list) else list(tokens)
        start -= start % self.page_size
        node, pos = self._roots.get(ns), 0
        while node is not None and pos + self.page_size <= len(toks):
            child = node.children.get(page_key(toks, pos, self.page_size))
            if child is None or owner not in child.owners:
                return 0
            size = len(child.key)
            same = size if toks[pos : pos + size] == child.key else self._common(child, toks, pos)
            if start < pos + size:
                if start - pos > same:
                    return 0
                return self._drop_from(child, start, owner)
            if same < size:
                return 0
            pos += size
            node = child
        return 0

    def remove_at(self, position: Position, owner: Owner) -> int | None:
        """``owner`` no longer holds the token at ``position.depth`` nor anything after it on
        that path. Returns the tokens it lost; None when the position is gone (its node was
        deleted): remove by tokens instead."""
        node = self._resolve(position, inside=True)
        if node is None:
            return None
        if owner not in node.owners:
            return 0
        return self._drop_from(node, position.depth - position.depth % self.page_size, owner)

    def _drop_from(self, node: Node, depth: int, owner: Owner) -> int:
        """Drop ``owner`` from token ``depth`` on (``node`` holds that token)."""
        start = node.depth - len(node.key)
        if depth > start:
            self._split(node, depth - start)  # ``node`` keeps the tail, from ``depth``
        return self._drop_subtree(node, owner)

    def drop_owner(self, owner: Owner) -> int:
        """``owner`` holds nothing any more (an engine restarted or left)."""
        state = self._owners.get(owner)
        if state is None:
            return 0
        tops = [n for n in state.nodes if n.parent is None or owner not in n.parent.owners]
        lost = sum(self._drop_subtree(node, owner) for node in tops)
        del self._owners[owner]
        return lost

    # -- locks and eviction ----------------------------------------------------------------
    def unlock(self, handle: Node | None, owner: Owner) -> None:
        """Release a lock taken by ``insert(..., lock=True)`` (the whole path to the root)."""
        node = handle
        while node is not None and node.parent is not None:
            count = node.locks.get(owner, 0)
            if count > 1:
                node.locks[owner] = count - 1
            elif count == 1:
                del node.locks[owner]
            node = node.parent
        self._enforce(owner)

    def _enforce(self, owner: Owner) -> None:
        state = self._owners.get(owner)
        if state is not None:
            enforce_owner(self, state, self._clock())

    def expire(self) -> int:
        """Drop every owner entry older than its owner's TTL; returns the tokens dropped."""
        now = self._clock()
        return sum(enforce_owner(self, s, now) for s in list(self._owners.values()))

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(tree))."""
        check_integrity(self, self._roots, self._owners)
        assert set(self._root_ns) == set(self._roots.values()), "root map out of sync"
