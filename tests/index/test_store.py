"""ChunkIndex against a naive model (dict of sets), including drops, bit reuse and sweeps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstack.index.store import ChunkIndex, Location

A, B, C = Location("a", "cpu"), Location("b", "cpu"), Location("shared", "redis://x")
KEYS = [bytes([i]) * 16 for i in range(12)]


def test_prefix_runs_per_location_and_union() -> None:
    index = ChunkIndex()
    index.add(A, KEYS[:3])
    index.add(B, KEYS[2:8])
    index.add(C, KEYS[:1])
    runs = index.prefix_runs(KEYS, {"a": [A], "b": [B], "c": [C], "a+b": [A, B], "none": []})
    assert runs == {"a": 3, "b": 0, "c": 1, "a+b": 8, "none": 0}
    assert index.holders(KEYS[2]) in ([A, B], [B, A])
    index.check_integrity()


def test_drop_is_immediate_and_sweep_frees_the_bit() -> None:
    index = ChunkIndex()
    index.add(A, KEYS)
    index.add(B, KEYS[:2])
    assert index.drop(A) == len(KEYS)
    assert index.holders(KEYS[5]) == [] and index.prefix_runs(KEYS, {"a": [A]}) == {"a": 0}
    while not index.sweep(3):
        pass
    assert len(index) == 2  # only B's entries are left
    index.add(C, KEYS[5:6])  # reuses A's bit: must not resurrect A's entries
    assert index.holders(KEYS[6]) == [] and index.holders(KEYS[5]) == [C]
    index.check_integrity()


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove", "drop", "sweep"]),
        st.sampled_from([A, B, C]),
        st.lists(st.sampled_from(KEYS), max_size=6),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_matches_a_naive_model(operations: list[tuple[str, Location, list[bytes]]]) -> None:
    index, model = ChunkIndex(), {A: set(), B: set(), C: set()}
    for op, location, keys in operations:
        if op == "add":
            index.add(location, keys)
            model[location] |= set(keys)
        elif op == "remove":
            index.remove(location, keys)
            model[location] -= set(keys)
        elif op == "drop":
            index.drop(location)
            model[location] = set()
        else:
            index.sweep(len(keys) + 1)
        for key in KEYS:
            assert set(index.holders(key)) == {loc for loc, ks in model.items() if key in ks}
        groups = {"a": [A], "b": [B], "ab": [A, B], "all": [A, B, C]}
        want = {name: _naive_run(model, locs) for name, locs in groups.items()}
        assert index.prefix_runs(KEYS, groups) == want
    while not index.sweep(5):
        pass
    index.check_integrity()


def _naive_run(model: dict[Location, set[bytes]], locations: list[Location]) -> int:
    run = 0
    for key in KEYS:
        if not any(key in model[loc] for loc in locations):
            break
        run += 1
    return run
