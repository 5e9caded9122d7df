"""Chunk planning of the connector, on small integer block tables."""

from __future__ import annotations

import pytest

from kvstack.integrations.plan import RequestTracker, block_aligned_hit


def tracker(num_tokens: int, chunk: int = 8, block: int = 4, ranks: int = 1) -> RequestTracker:
    prompt = list(range(num_tokens))
    keys = [[bytes([r, c]) for c in range(num_tokens // chunk)] for r in range(ranks)]
    return RequestTracker("r1", prompt, keys, chunk, block)


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


def test_saves_only_full_prompt_chunks_once_computed() -> None:
    t = tracker(20)  # 2 full chunks (16 tokens) + 4 tokens
    t.set_blocks([1, 2, 3], replace=True)
    assert t.take_saves(7, with_tokens=True) is None  # chunk 0 not computed yet
    first = t.take_saves(12, with_tokens=True)
    assert first is not None and [c.chunk for c in first.chunks] == [0]
    assert first.chunks[0].tokens == list(range(8)) and first.chunks[0].parent is None
    t.set_blocks([4, 5], replace=False)  # block table grows with chunked prefill
    second = t.take_saves(40, with_tokens=True)  # decode tokens never make a chunk
    assert second is not None and [c.chunk for c in second.chunks] == [1]
    assert second.chunks[0].block_ids == [3, 4] and second.chunks[0].parent == bytes([0, 0])
    assert t.take_saves(40, with_tokens=True) is None


def test_chunks_known_stored_are_not_saved_again() -> None:
    t = tracker(24)
    t.set_blocks(list(range(6)), replace=True)
    t.mark_stored(2)
    saves = t.take_saves(24, with_tokens=False)
    assert saves is not None and [c.chunk for c in saves.chunks] == [2]
    assert saves.chunks[0].tokens is None


def test_keys_per_tensor_parallel_rank() -> None:
    t = tracker(16, ranks=2)
    t.set_blocks([7, 8, 9, 10], replace=True)
    t.set_load(0, 8)
    loads = t.take_loads()
    assert loads is not None and loads.chunks[0].keys == (bytes([0, 0]), bytes([1, 0]))


def test_a_short_block_table_is_an_error_not_a_wrong_load() -> None:
    t = tracker(16)
    t.set_blocks([1], replace=True)
    t.set_load(0, 8)
    with pytest.raises(ValueError, match="too few"):
        t.take_loads()
