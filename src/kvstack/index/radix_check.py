"""``check_integrity`` of a radix tree (:class:`~kvstack.index.radix_tree.TreeCore`, the base of
:class:`~kvstack.index.radix.RadixIndex`): every invariant the tree relies on, checked from
scratch (tests and debugging; O(tree))."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvstack.index.radix_node import Node, Owner, OwnerState, RadixNamespace
from kvstack.index.radix_walk import page_key

if TYPE_CHECKING:
    from kvstack.index.radix_tree import TreeCore

__all__ = ["check_integrity"]


def check_integrity(
    index: TreeCore, roots: Mapping[RadixNamespace, Node], owners: Mapping[Owner, OwnerState]
) -> None:
    """Raise AssertionError naming the first broken invariant."""
    seen: dict[Owner, list[Node]] = {o: [] for o in owners}
    num_tokens = num_nodes = 0
    for ns, root in roots.items():
        assert root.parent is None and not root.key and not root.owners, f"bad root of {ns}"
        assert root.children, f"namespace {ns} is empty but kept"
        stack = [root]
        while stack:
            node = stack.pop()
            for first, child in node.children.items():
                _check_child(index, node, first, child)
                num_tokens += len(child.key)
                num_nodes += 1
                for owner in child.owners:
                    assert owner in seen, f"{child} names unknown owner {owner}"
                    seen[owner].append(child)
                stack.append(child)
    assert num_tokens == index.num_tokens, f"num_tokens {index.num_tokens} != {num_tokens}"
    assert num_nodes == index.num_nodes, f"num_nodes {index.num_nodes} != {num_nodes}"
    for owner, state in owners.items():
        _check_owner(owner, state, seen[owner])


def _check_child(index: TreeCore, parent: Node, first: tuple[int, ...], child: Node) -> None:
    size = index.page_size
    assert child.parent is parent, f"{child} has the wrong parent"
    assert child.key and len(child.key) % size == 0, f"{child} is not whole pages"
    assert first == page_key(child.key, 0, size), f"{child} is filed under the wrong page"
    assert child.depth == parent.depth + len(child.key), f"{child} has the wrong depth"
    assert child.owners, f"{child} has no owner but was kept"
    if parent.parent is not None:
        extra = child.owners.keys() - parent.owners.keys()
        assert not extra, f"{child}: owners {extra} do not hold its parent (not prefix-closed)"
    for owner, count in child.locks.items():
        assert count > 0 and owner in child.owners, f"{child}: bad lock {owner}={count}"
        if parent.parent is not None:
            assert parent.locks.get(owner, 0) >= count, f"{child}: lock not on its parent"


def _check_owner(owner: Owner, state: OwnerState, nodes: list[Node]) -> None:
    assert state.nodes == set(nodes), f"{owner}: node set out of sync"
    tokens = sum(len(n.key) for n in nodes)
    assert state.tokens == tokens, f"{owner}: tokens {state.tokens} != {tokens}"
    live = {e[3] for e in state.heap if e[3] in state.nodes and e[3].owners[owner] == e[0]}
    assert live == state.nodes, f"{owner}: some nodes have no LRU entry"
    capacity = state.policy.capacity_tokens
    if capacity is not None:
        locked = sum(len(n.key) for n in nodes if n.locked(owner))
        assert tokens - locked <= capacity, f"{owner}: {tokens} tokens over capacity {capacity}"
