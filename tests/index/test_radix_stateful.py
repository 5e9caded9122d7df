"""Randomized operation sequences on RadixIndex against a reference model, each step ending in
``check_integrity()``.

The model keeps, per owner, the set of page prefixes it holds (prefix-closed by construction).
Without capacities the tree must answer every match exactly like the model; with capacities and
a TTL it may only forget (answers are bounded by the model's) and must respect the bounds.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvstack.index.radix import (
    InsertResult,
    Owner,
    OwnerPolicy,
    Position,
    RadixIndex,
    RadixNamespace,
)

PAGE = 2
NAMESPACES = [RadixNamespace("m"), RadixNamespace("m", adapter="x")]
OWNERS = [Owner("a"), Owner("b"), Owner("a", "cpu")]
# A tiny alphabet and short prompts make shared prefixes, splits and divergences common.
prompts = st.lists(st.integers(0, 2), min_size=0, max_size=12)
namespaces = st.sampled_from(NAMESPACES)
owners = st.sampled_from(OWNERS)

Prefix = tuple[RadixNamespace, tuple[int, ...]]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class ExactRadix(RuleBasedStateMachine):
    """No capacity, no TTL: the tree is exactly the model."""

    capacity: int | None = None
    ttl_s: float | None = None

    @initialize()
    def setup(self) -> None:
        self.clock = Clock()
        policy = OwnerPolicy(capacity_tokens=self.capacity, ttl_s=self.ttl_s)
        self.tree = RadixIndex(page_size=PAGE, default_policy=policy, clock=self.clock)
        self.model: dict[Owner, set[Prefix]] = {o: set() for o in OWNERS}
        self.locks: list[tuple[object, Owner]] = []
        # Positions handed out by inserts: (anchor result, namespace, the path's tokens).
        self.anchors: list[tuple[InsertResult, RadixNamespace, list[int]]] = []

    def model_match(self, ns: RadixNamespace, tokens: list[int], owner: Owner) -> int:
        best = 0
        for end in range(PAGE, len(tokens) + 1, PAGE):
            if (ns, tuple(tokens[:end])) not in self.model[owner]:
                break
            best = end
        return best

    @rule(ns=namespaces, tokens=prompts, owner=owners, lock=st.booleans())
    def insert(self, ns: RadixNamespace, tokens: list[int], owner: Owner, lock: bool) -> None:
        self.clock.now += 1
        result = self.tree.insert(ns, tokens, owner, lock=lock)
        self.model_insert(ns, tokens, owner)
        if result.lock is not None:
            self.locks.append((result.lock, owner))
        if result.end is not None:
            self.anchors.append((result, ns, tokens[: result.depth]))

    def model_insert(self, ns: RadixNamespace, tokens: list[int], owner: Owner) -> None:
        for end in range(PAGE, len(tokens) - len(tokens) % PAGE + 1, PAGE):
            self.model[owner].add((ns, tuple(tokens[:end])))

    def model_remove(self, ns: RadixNamespace, tokens: list[int], owner: Owner, start: int) -> None:
        start -= start % PAGE
        cut = (ns, tuple(tokens[: start + PAGE]))
        if len(cut[1]) == start + PAGE and cut in self.model[owner]:
            self.model[owner] = {
                (n, p)
                for n, p in self.model[owner]
                if not (n == ns and len(p) > start and p[: start + PAGE] == cut[1])
            }

    @rule(data=st.data(), tokens=prompts, owner=owners)
    def insert_at(self, data: st.DataObject, tokens: list[int], owner: Owner) -> None:
        """Like a KV event naming a parent block: continue a known path from a position."""
        if not self.anchors:
            return
        anchor, ns, path = data.draw(st.sampled_from(self.anchors))
        depth = data.draw(st.integers(0, len(path) // PAGE)) * PAGE
        self.clock.now += 1
        full = path[:depth] + tokens
        assert anchor.end is not None
        result = self.tree.insert_at(Position(anchor.end, depth), tokens, owner)
        if result is None:  # the anchor's node is gone: the caller re-inserts by tokens
            result = self.tree.insert(ns, full, owner)
        self.model_insert(ns, full, owner)
        if result.end is not None:
            self.anchors.append((result, ns, full[: result.depth]))

    @rule(data=st.data(), owner=owners)
    def remove_at(self, data: st.DataObject, owner: Owner) -> None:
        if not self.anchors:
            return
        anchor, ns, path = data.draw(st.sampled_from(self.anchors))
        if not path:
            return
        start = data.draw(st.integers(0, len(path) // PAGE - 1)) * PAGE
        assert anchor.end is not None
        if self.tree.remove_at(Position(anchor.end, start), owner) is None:
            self.tree.remove(ns, path, owner, start)
        self.model_remove(ns, path, owner, start)

    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        if self.locks:
            handle, owner = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
            self.tree.unlock(handle, owner)  # type: ignore[arg-type]

    @rule(ns=namespaces, tokens=prompts, owner=owners, start=st.integers(0, 10))
    def remove(self, ns: RadixNamespace, tokens: list[int], owner: Owner, start: int) -> None:
        self.tree.remove(ns, tokens, owner, start)
        self.model_remove(ns, tokens, owner, start)

    @rule(owner=owners)
    def drop_owner(self, owner: Owner) -> None:
        self.tree.drop_owner(owner)
        self.model[owner] = set()
        self.locks = [(h, o) for h, o in self.locks if o != owner]

    @rule(ns=namespaces, tokens=prompts)
    def match(self, ns: RadixNamespace, tokens: list[int]) -> None:
        got = self.tree.match(ns, tokens)
        for owner in OWNERS:
            self.compare(got.tokens(owner), self.model_match(ns, tokens, owner))

    def compare(self, got: int, expected: int) -> None:
        assert got == expected, f"tree says {got}, model {expected}"

    @invariant()
    def integrity(self) -> None:
        if hasattr(self, "tree"):
            self.tree.check_integrity()


class BoundedRadix(ExactRadix):
    """Capacities and a TTL: the tree forgets, never invents, and stays within bounds."""

    capacity = 6
    ttl_s = 25.0

    def compare(self, got: int, expected: int) -> None:
        assert got <= expected, f"tree says {got}, model only {expected}"

    @rule()
    def expire(self) -> None:
        self.tree.expire()

    @invariant()
    def bounded(self) -> None:
        if not hasattr(self, "tree"):
            return
        for owner in OWNERS:
            held = self.tree.owned_tokens(owner)
            locked = any(o == owner for _, o in self.locks)
            assert locked or held <= self.capacity, f"{owner} holds {held} > {self.capacity}"


TestExactRadix = ExactRadix.TestCase
TestExactRadix.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestBoundedRadix = BoundedRadix.TestCase
TestBoundedRadix.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
