"""The radix tree's structure and its edits, without policy: roots per namespace, paths found
or created, nodes split, grown, owned and deleted. :class:`~kvstack.index.radix.RadixIndex`
builds the public API and eviction on top.

A :class:`Position` names a place in the tree by a node at or below it and a depth in tokens.
Because a split only ever inserts a new node *above* an existing one, a node's end depth never
shrinks and a node's tokens never change, walking up from the remembered node always finds
the place again — even from a deleted node, whose parent link is kept: the position is gone
only when the node that holds it was deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from kvstack.index.radix_node import Node, Owner, OwnerPolicy, OwnerState, RadixNamespace
from kvstack.index.radix_walk import common_prefix, page_key

__all__ = ["Position", "TreeCore"]


class Position(NamedTuple):
    node: Node  # the place is on the path from the root to this node
    depth: int  # tokens from the root


class TreeCore:
    def __init__(
        self,
        page_size: int,
        max_tokens: int | None,
        default_policy: OwnerPolicy | None,
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
        self._roots: dict[RadixNamespace, Node] = {}
        self._root_ns: dict[Node, RadixNamespace] = {}
        self._owners: dict[Owner, OwnerState] = {}
        self.num_tokens = 0  # tokens in all nodes (each node counted once)
        self.num_nodes = 0

    def _state(self, owner: Owner) -> OwnerState:
        state = self._owners.get(owner)
        if state is None:
            state = self._owners[owner] = OwnerState(owner, self.default_policy)
        return state

    def _root(self, ns: RadixNamespace) -> Node:
        node = self._roots.get(ns)
        if node is None:
            node = self._roots[ns] = Node([], None, 0)
            self._root_ns[node] = ns
        return node

    def _common(self, node: Node, tokens: list[int], pos: int) -> int:
        return common_prefix(node.key, tokens, pos, self.page_size)

    # -- paths -----------------------------------------------------------------------------
    def _descend(
        self, node: Node, toks: list[int], end: int, owner: Owner
    ) -> tuple[list[Node], int]:
        """The nodes below ``node`` covering ``toks[:end]``, split or created as needed, and
        the tokens by which a leaf already held by ``owner`` grew in place."""
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
            same = min(same, end - pos)
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

    def _own(self, path: list[Node], owner: Owner, lock: bool) -> int:
        """``owner`` holds every node of ``path`` (root side first); touched deepest first, so
        ancestors end up more recent. Returns the tokens it did not hold before."""
        state = self._state(owner)
        now = self._clock()
        new_tokens = 0
        for node in reversed(path):
            if owner not in node.owners:
                state.nodes.add(node)
                state.tokens += len(node.key)
                new_tokens += len(node.key)
            node.owners[owner] = now
            state.touch(node, now)
            if lock:
                node.locks[owner] = node.locks.get(owner, 0) + 1
        return new_tokens

    @staticmethod
    def _ancestors(node: Node) -> list[Node]:
        """``node`` and its ancestors below the root, root side first."""
        chain = []
        while node.parent is not None:
            chain.append(node)
            node = node.parent
        chain.reverse()
        return chain

    # -- positions -------------------------------------------------------------------------
    def _resolve(self, position: Position, inside: bool) -> Node | None:
        """The node holding ``position``: the one whose tokens end at or after it
        (``inside``: the one holding the token at index ``depth``). None if gone."""
        node, depth = position
        if depth > node.depth or (inside and depth >= node.depth):
            return None
        target = depth + 1 if inside else depth
        while node.parent is not None and node.depth - len(node.key) >= target:
            node = node.parent
        if not node.alive or (node.parent is None and depth != 0):
            return None
        return node

    # -- structural edits ------------------------------------------------------------------
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
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key) and at % self.page_size == 0
        upper = Node(node.key[:at], parent, node.depth - len(node.key) + at)
        upper.owners = dict(node.owners)
        upper.locks = dict(node.locks)
        parent.children[page_key(upper.key, 0, self.page_size)] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[page_key(node.key, 0, self.page_size)] = node
        self.num_nodes += 1
        for owner, seen in upper.owners.items():
            state = self._owners[owner]
            state.nodes.add(upper)
            state.touch(upper, seen)
        return upper

    def _split_at_depth(self, node: Node, depth: int) -> Node:
        """The node ending at ``depth`` (``node`` holds it): ``node`` itself or its new upper
        part."""
        start = node.depth - len(node.key)
        if node.parent is None or depth == node.depth:
            return node
        return self._split(node, depth - start)

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
        node.alive = False
        if parent.parent is None and not parent.children:  # an empty namespace
            del self._roots[self._root_ns.pop(parent)]
            parent.alive = False
