"""Chunk planning of the connector, on small integer block tables."""

from __future__ import annotations

import pytest

from kvstack.integrations.plan import RequestTracker, block_aligned_hit
from kvstack.kv.keys import chunk_keys

SEED = bytes(16)


def tracker(
    num_tokens: int,
    chunk: int = 8,
    block: int = 4,
    ranks: int = 1,
    prompt: int | None = None,
    save_generated: bool = True,
) -> RequestTracker:
    tokens = list(range(num_tokens))
    seeds = [bytes([r]) * 16 for r in range(ranks)]
    return RequestTracker(
        "r1", tokens, num_tokens if prompt is None else prompt, seeds, chunk, block,
        save_generated=save_generated,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("hit", "prompt", "expected"),
    [(0, 10, 0), (8, 10, 8), (16, 16, 12), (16, 17, 16), (8, 8, 4), (8, 1, 0), (7, 100, 4)],
)
def test_block_aligned_hit_keeps_last_token_and_whole_blocks(
    hit: int, prompt: int, expected: int
) -> None:
    assert block_aligned_hit(hit, prompt, 4) == expected


def test_load_skips_blocks_the_engine_has_and_stops_before_the_last_token() -> None:
    t = tracker(24)  # 3 chunks of 8 tokens = 6 blocks of 4
    t.set_blocks([10, 11, 12, 13, 14, 15], replace=True)
    t.set_load(start_token=4, num_tokens=16)  # engine holds block 0; load blocks 1..4
    loads = t.take_loads()
    assert loads is not None
    assert [(c.chunk, c.first_block, c.block_ids) for c in loads.chunks] == [
        (0, 1, [11]),
        (1, 0, [12, 13]),
        (2, 0, [14]),
    ]
    assert t.take_loads() is None  # a load is taken once


def test_saves_only_full_prompt_chunks_once_computed_without_generated() -> None:
    t = tracker(20, save_generated=False)  # 2 full chunks (16 tokens) + 4 tokens
    t.set_blocks([1, 2, 3], replace=True)
    assert t.take_saves(7, with_tokens=True) is None  # chunk 0 not computed yet
    first = t.take_saves(12, with_tokens=True)
    assert first is not None and [c.chunk for c in first.chunks] == [0]
    assert first.chunks[0].tokens == list(range(8)) and first.chunks[0].parent is None
    t.set_blocks([4, 5], replace=False)  # block table grows with chunked prefill
    second = t.take_saves(40, with_tokens=True)
    assert second is not None and [c.chunk for c in second.chunks] == [1]
    assert second.chunks[0].block_ids == [3, 4] and second.chunks[0].parent == t.keys[0][0]
    assert t.take_saves(40, with_tokens=True) is None


def test_generated_tokens_make_chunks_once_their_kv_is_computed() -> None:
    tokens = list(range(12))  # a 12-token prompt: one full chunk of 8
    t = RequestTracker("r", tokens, 12, [SEED], 8, 4)
    t.set_blocks([1, 2, 3], replace=True)
    saved = t.take_saves(12, with_tokens=True)
    assert saved is not None and [c.chunk for c in saved.chunks] == [0]
    assert not saved.chunks[0].generated
    tokens += [100, 101, 102, 103, 104]  # the engine appends generated tokens
    t.set_blocks([4], replace=False)
    assert t.take_saves(15, with_tokens=True) is None  # positions 15 and 16 have no KV yet
    saved = t.take_saves(16, with_tokens=True)
    assert saved is not None and [c.chunk for c in saved.chunks] == [1]
    chunk = saved.chunks[0]
    assert chunk.generated and chunk.tokens == [8, 9, 10, 11, 100, 101, 102, 103]
    assert chunk.keys == (chunk_keys(tokens[:16], SEED, 8)[1],)  # the chain over all tokens


def test_keys_grow_with_the_tokens_and_equal_a_fresh_chain() -> None:
    tokens = list(range(10))
    t = RequestTracker("r", tokens, 10, [SEED], 4, 4)
    assert t.lookup_keys() == [chunk_keys(tokens, SEED, 4)]
    tokens += list(range(50, 60))
    assert t.lookup_keys() == [chunk_keys(tokens, SEED, 4)]
    assert len(t.lookup_keys()[0]) == 5


def test_chunks_known_stored_are_not_saved_again_until_a_load_fails() -> None:
    t = tracker(24)
    t.set_blocks(list(range(6)), replace=True)
    t.mark_stored(2)
    saves = t.take_saves(24, with_tokens=False)
    assert saves is not None and [c.chunk for c in saves.chunks] == [2]
    assert saves.chunks[0].tokens is None
    assert t.chunks_of_blocks({3, 5}) == [1, 2]
    t.forget_stored_from(1)  # blocks of chunk 1 failed to load: recomputed, then saved
    again = t.take_saves(24, with_tokens=False)
    assert again is not None and [c.chunk for c in again.chunks] == [1, 2]


def test_recomputed_tokens_after_preemption_are_counted() -> None:
    t = tracker(24)
    assert t.note_computed(0, 16) == 0
    assert t.note_computed(16, 20) == 0
    assert t.note_computed(8, 12) == 4  # resumed with 8 tokens loaded: 4 computed again
    assert t.note_computed(12, 22) == 8  # 12..20 again, 20..22 new
    assert t.max_computed == 22


def test_keys_per_tensor_parallel_rank() -> None:
    t = tracker(16, ranks=2)
    t.set_blocks([7, 8, 9, 10], replace=True)
    t.set_load(0, 8)
    loads = t.take_loads()
    assert loads is not None
    expected = tuple(chunk_keys(list(range(16)), bytes([r]) * 16, 8)[0] for r in (0, 1))
    assert loads.chunks[0].keys == expected and expected[0] != expected[1]


def test_a_short_block_table_is_an_error_not_a_wrong_load() -> None:
    t = tracker(16)
    t.set_blocks([1], replace=True)
    t.set_load(0, 8)
    with pytest.raises(ValueError, match="too few"):
        t.take_loads()
