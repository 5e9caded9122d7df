"""``RadixIndex``: which owners (backend, tier) hold which token prefixes, page by page.

A radix tree over token ids per :class:`Namespace` (model, LoRA adapter and cache salt never
share nodes). Matching is page-granular: only whole pages of ``page_size`` tokens are stored
and matched, as an engine caches whole blocks. Each node carries the owners holding it, and
ownership is prefix-closed, so one walk down the tree gives every owner's matched length.

Protocol::

    index = RadixIndex(page_size=16)
    index.set_policy(Owner("a", "routed"), OwnerPolicy(capacity_tokens=..., ttl_s=...))
    match = index.match(ns, tokens)                    # no side effects
    match.tokens(Owner("a", "gpu"))                    # matched prefix length, in tokens
    result = index.insert(ns, tokens, owner, lock=True)  # now held by owner (LRU touched)
    index.unlock(result.lock)                           # the request that pinned it ended
    index.remove(ns, tokens, owner, start=128)          # owner lost tokens[128:] (and beyond)
    index.drop_owner(owner)                             # owner lost everything
    index.expire()                                      # TTL sweep
    index.check_integrity()                             # raises AssertionError if broken

Eviction: an owner over its capacity loses its least recently used leaves first, page-exact
(the tail of a node is split off); nodes pinned by a lock are skipped. The whole tree is also
bounded by ``max_tokens``: past it, the globally oldest owner entries go. A node with no owner
left is deleted. Not thread-safe: the router uses it from its event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvstack.index.radix_node import Namespace, Node, Owner, OwnerPolicy, OwnerState
from kvstack.index.radix_walk import common_prefix, page_key

__all__ = ["InsertResult", "Namespace", "Owner", "OwnerPolicy", "PrefixMatch", "RadixIndex"]


class PrefixMatch(NamedTuple):
    num_tokens: int  # the query's length
    matched: dict[Owner, int]  # owner -> tokens matched from the start (owners with 0 absent)

    def tokens(self, owner: Owner) -> int:
        return self.matched.get(owner, 0)

    def best(self) -> int:
        return max(self.matched.values(), default=0)


class InsertResult(NamedTuple):
    new_tokens: int  # tokens the owner did not hold before
    lock: Node | None  # pass to unlock() when asked for a lock


class RadixIndex:
    def __init__(
        self,
        page_size: int = 16,
        max_tokens: int | None = None,
        default_policy: OwnerPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.page_size = page_size
        self.max_tokens = max_tokens
        self.default_policy = default_policy or OwnerPolicy()
        self._clock = clock
        self._roots: dict[Namespace, Node] = {}
        self._root_ns: dict[Node, Namespace] = {}
        self._owners: dict[Owner, OwnerState] = {}
        self.num_tokens = 0  # tokens in all nodes (each node counted once)
        self.num_nodes = 0

    # -- owners ----------------------------------------------------------------------------
    def set_policy(self, owner: Owner, policy: OwnerPolicy) -> None:
        """Set ``owner``'s capacity and TTL (applied at once)."""
        self._state(owner).policy = policy
        self._enforce(owner)

    def owned_tokens(self, owner: Owner) -> int:
        state = self._owners.get(owner)
        return 0 if state is None else state.tokens

    def owners(self) -> list[Owner]:
        return [o for o, s in self._owners.items() if s.nodes]

    def _state(self, owner: Owner) -> OwnerState:
        state = self._owners.get(owner)
        if state is None:
            state = self._owners[owner] = OwnerState(owner, self.default_policy)
        return state

    # -- queries ---------------------------------------------------------------------------
    def match(self, ns: Namespace, tokens: Sequence[int]) -> PrefixMatch:
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

    def _common(self, node: Node, tokens: list[int], pos: int) -> int:
        return common_prefix(node.key, tokens, pos, self.page_size)

    # -- updates ---------------------------------------------------------------------------
    def insert(
        self, ns: Namespace, tokens: Sequence[int], owner: Owner, lock: bool = False
    ) -> InsertResult:
        """Record that ``owner`` holds every whole page of ``tokens``; touch its LRU entries.
        With ``lock``, pin the path for ``owner`` until :meth:`unlock`."""
        toks = tokens if isinstance(tokens, list) else list(tokens)
        end = len(toks) - len(toks) % self.page_size
        state = self._state(owner)
        now = self._clock()
        if end == 0:
            return InsertResult(0, None)
        path, new_tokens = self._path(ns, toks, end, owner)
        for node in reversed(path):  # deepest first: ancestors end up more recent
            if owner not in node.owners:
                state.nodes.add(node)
                state.tokens += len(node.key)
                new_tokens += len(node.key)
            node.owners[owner] = now
            state.touch(node, now)
            if lock:
                node.locks[owner] = node.locks.get(owner, 0) + 1
        self._enforce(owner)
        self._enforce_total()
        return InsertResult(new_tokens, path[-1] if lock and path else None)

    def _path(
        self, ns: Namespace, toks: list[int], end: int, owner: Owner
    ) -> tuple[list[Node], int]:
        """The nodes covering ``toks[:end]``, split or created as needed, and the tokens a
        node already held by ``owner`` grew by."""
        node = self._roots.get(ns)
        if node is None:
            node = self._roots[ns] = Node([], None, 0)
            self._root_ns[node] = ns
        path: list[Node] = []
        pos = 0
        while pos < end:
            child = node.children.get(page_key(toks, pos, self.page_size))
            if child is None:
                if self._can_extend(node, owner):
                    self._extend(node, toks[pos:end])
                    return path, end - pos
                path.append(self._new_child(node, toks[pos:end]))
                return path, 0
            size = len(child.key)
            same = size if toks[pos : pos + size] == child.key else self._common(child, toks, pos)
            if pos + same > end:
                same = end - pos
            if same < size:
                child = self._split(child, same)
            path.append(child)
            pos += same
            node = child
        return path, 0

    def _can_extend(self, node: Node, owner: Owner) -> bool:
        """A leaf held by ``owner`` alone grows in place (decode blocks, the next chat round)
        instead of gaining a chain of one-page children."""
        return (
            node.parent is not None
            and not node.children
            and not node.locks
            and len(node.owners) == 1
            and owner in node.owners
        )

    def _extend(self, node: Node, tokens: list[int]) -> None:
        node.key = node.key + tokens
        node.depth += len(tokens)
        self.num_tokens += len(tokens)
        for owner in node.owners:
            self._owners[owner].tokens += len(tokens)

    def _new_child(self, parent: Node, tokens: list[int]) -> Node:
        child = Node(tokens, parent, parent.depth + len(tokens))
        parent.children[page_key(tokens, 0, self.page_size)] = child
        self.num_tokens += len(tokens)
        self.num_nodes += 1
        return child

    def _split(self, node: Node, at: int) -> Node:
        """Cut ``node`` after ``at`` tokens (a page multiple); return the new upper part,
        which takes over the node's place, owners, access times and locks."""
        assert node.parent is not None and 0 < at < len(node.key) and at % self.page_size == 0
        upper = Node(node.key[:at], node.parent, node.depth - len(node.key) + at)
        upper.owners = dict(node.owners)
        upper.locks = dict(node.locks)
        node.parent.children[page_key(upper.key, 0, self.page_size)] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[page_key(node.key, 0, self.page_size)] = node
        self.num_nodes += 1
        for owner, seen in upper.owners.items():
            state = self._owners[owner]
            state.nodes.add(upper)
            state.touch(upper, seen)
        return upper

    def remove(self, ns: Namespace, tokens: Sequence[int], owner: Owner, start: int = 0) -> int:
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
            if pos == start:
                return self._drop_subtree(child, owner)
            size = len(child.key)
            same = size if toks[pos : pos + size] == child.key else self._common(child, toks, pos)
            if start < pos + size:
                if start - pos > same:
                    return 0
                self._split(child, start - pos)  # child now begins at ``start``
                return self._drop_subtree(child, owner)
            if same < size:
                return 0
            pos += size
            node = child
        return 0

    def drop_owner(self, owner: Owner) -> int:
        """``owner`` holds nothing any more (an engine restarted or left)."""
        state = self._owners.get(owner)
        if state is None:
            return 0
        lost = 0
        for node in [n for n in state.nodes if n.parent is None or owner not in n.parent.owners]:
            lost += self._drop_subtree(node, owner)
        del self._owners[owner]
        return lost

    def _drop_subtree(self, node: Node, owner: Owner) -> int:
        """Remove ``owner`` from ``node`` and its descendants; delete nodes left ownerless."""
        if owner not in node.owners:
            return 0
        lost = 0
        for child in list(node.children.values()):
            lost += self._drop_subtree(child, owner)
        del node.owners[owner]
        node.locks.pop(owner, None)
        state = self._owners[owner]
        state.nodes.discard(node)
        state.tokens -= len(node.key)
        lost += len(node.key)
        if not node.owners:
            self._delete(node)
        return lost

    def _delete(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[page_key(node.key, 0, self.page_size)]
        self.num_tokens -= len(node.key)
        self.num_nodes -= 1
        if parent.parent is None and not parent.children:  # an empty namespace
            del self._roots[self._root_ns.pop(parent)]

    # -- locks -----------------------------------------------------------------------------
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

    # -- eviction --------------------------------------------------------------------------
    def _enforce(self, owner: Owner) -> None:
        state = self._owners.get(owner)
        if state is None:
            return
        ttl_s = state.policy.ttl_s
        if ttl_s is not None:
            self._expire_owner(state, self._clock() - ttl_s)
        capacity = state.policy.capacity_tokens
        if capacity is not None and state.tokens > capacity:
            self._evict(state, lambda: state.tokens - capacity)

    def _enforce_total(self) -> None:
        limit = self.max_tokens
        if limit is None or self.num_tokens <= limit:
            return
        while self.num_tokens > limit:
            oldest = [(e[0], s) for s in self._owners.values() if (e := s.oldest()) is not None]
            if not oldest:
                return
            state = min(oldest, key=lambda pair: pair[0])[1]
            if not self._evict(state, lambda: self.num_tokens - limit, once=True):
                return

    def expire(self) -> int:
        """Drop every owner entry older than its owner's TTL; returns the tokens dropped."""
        now = self._clock()
        lost = 0
        for state in list(self._owners.values()):
            if state.policy.ttl_s is not None:
                lost += self._expire_owner(state, now - state.policy.ttl_s)
        return lost

    def _expire_owner(self, state: OwnerState, cutoff: float) -> int:
        lost, kept = 0, []
        while (entry := state.oldest()) is not None and entry[0] < cutoff:
            state.pop_oldest()
            if entry[3].locked(state.owner):
                kept.append(entry)
                continue
            lost += self._drop_subtree(entry[3], state.owner)
        self._restore(state, kept)
        return lost

    def _evict(self, state: OwnerState, excess: Callable[[], int], once: bool = False) -> bool:
        """Evict ``state``'s oldest unlocked entries while ``excess() > 0``; True if any went."""
        kept, evicted = [], False
        while excess() > 0 and (entry := state.pop_oldest()) is not None:
            node = entry[3]
            if node.locked(state.owner):
                kept.append(entry)
                continue
            pages = -(-excess() // self.page_size)
            keep = len(node.key) - pages * self.page_size
            if keep > 0 and not any(state.owner in c.owners for c in node.children.values()):
                self._split(node, keep)  # only the tail goes; the upper part keeps its place
            self._drop_subtree(node, state.owner)
            evicted = True
            if once:
                break
        self._restore(state, kept)
        return evicted

    @staticmethod
    def _restore(state: OwnerState, entries: list[tuple[float, int, int, Node]]) -> None:
        for entry in entries:
            state.touch(entry[3], entry[0])

    # -- checks ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        from kvstack.index.radix_check import check_integrity

        check_integrity(self, self._roots, self._owners)
        assert set(self._root_ns) == set(self._roots.values()), "root map out of sync"
