"""Chunk keys: deterministic across processes, isolated by namespace, partial-chunk rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kvstack.kv.keys import (
    KEY_BYTES,
    Namespace,
    chunk_keys,
    chunk_spans,
    iter_chunk_keys,
    token_bytes,
)

NS = Namespace("llama-3-8b@abc123", "bfloat16")
TOKENS = [(i * 7919) % 128_000 for i in range(1000)]

_CHILD = """
import json, sys
from kvstack.kv.keys import Namespace, chunk_keys
ns = Namespace("llama-3-8b@abc123", "bfloat16", adapter="a@1", salt="t")
tokens = [(i * 7919) % 128_000 for i in range(1000)]
print(json.dumps([k.hex() for k in chunk_keys(tokens, ns, 256, partial=True)]))
"""


def test_keys_are_identical_across_processes_and_hash_seeds() -> None:
    ns = Namespace("llama-3-8b@abc123", "bfloat16", adapter="a@1", salt="t")
    here = [k.hex() for k in chunk_keys(TOKENS, ns, 256, partial=True)]
    for seed in ("0", "1", "12345", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == here, f"keys differ under PYTHONHASHSEED={seed}"


def test_key_format_is_pinned() -> None:
    # Keys are a wire format shared by router, index, connector and simulator processes (and
    # by files on disk): changing them must be deliberate. These values pin BLAKE2b-128 over
    # length-prefixed namespace fields and u32le tokens.
    keys = chunk_keys(list(range(8)), Namespace("m"), 4)
    assert [len(k) for k in keys] == [KEY_BYTES, KEY_BYTES]
    assert Namespace("m").digest().hex() == _golden_namespace()
    assert keys[1] == _golden_chain(keys[0], list(range(4, 8)))
    assert [k.hex() for k in keys] == [
        "546d4b8b8375ed6947c5fec7db673f8a",
        "c8c50fb0ca989b96fdb4c309a310c4fb",
    ]
    # A partial last chunk is prefixed with its own length, not the chunk size.
    partial = chunk_keys(list(range(11)), Namespace("m"), 4, partial=True)
    assert partial[:2] == keys
    assert partial[2] == _golden_chain(keys[1], list(range(8, 11)))


def _golden_namespace() -> str:
    import hashlib
    import struct

    h = hashlib.blake2b(b"kvstack-namespace-v1", digest_size=16)
    for field in ("m", "auto", "1", "0", "1", "", ""):
        h.update(struct.pack("<I", len(field)) + field.encode())
    return h.hexdigest()


def _golden_chain(prev: bytes, tokens: list[int]) -> bytes:
    import hashlib
    import struct

    h = hashlib.blake2b(prev, digest_size=16)
    h.update(struct.pack("<I", len(tokens)) + struct.pack(f"<{len(tokens)}I", *tokens))
    return h.digest()


@pytest.mark.parametrize(
    "other",
    [
        Namespace("llama-3-8b@def456", "bfloat16"),  # another revision
        Namespace("llama-3-8b@abc123", "float16"),  # another KV dtype
        Namespace("llama-3-8b@abc123", "bfloat16", layout_version=2),
        Namespace("llama-3-8b@abc123", "bfloat16", tp_rank=1, tp_size=2),
        Namespace("llama-3-8b@abc123", "bfloat16", tp_rank=0, tp_size=2),
        Namespace("llama-3-8b@abc123", "bfloat16", adapter="sql@1"),
        Namespace("llama-3-8b@abc123", "bfloat16", adapter="sql@2"),
        Namespace("llama-3-8b@abc123", "bfloat16", salt="tenant-a"),
    ],
)
def test_every_namespace_field_isolates_keys(other: Namespace) -> None:
    mine = set(chunk_keys(TOKENS, NS, 256))
    theirs = set(chunk_keys(TOKENS, other, 256))
    assert mine and theirs and not mine & theirs


def test_fields_are_length_prefixed() -> None:
    # "ab" + "c" must not collide with "a" + "bc" across adjacent fields.
    a = Namespace("m", adapter="ab", salt="c").digest()
    b = Namespace("m", adapter="a", salt="bc").digest()
    assert a != b


def test_keys_chain_prefixes() -> None:
    keys = chunk_keys(TOKENS, NS, 256)
    assert len(keys) == 3  # 1000 tokens: three full chunks, no partial one by default
    assert chunk_keys(TOKENS[:512], NS, 256) == keys[:2]
    changed = [*TOKENS[:10], TOKENS[10] + 1, *TOKENS[11:]]
    assert all(a != b for a, b in zip(chunk_keys(changed, NS, 256), keys, strict=True))
    later = [*TOKENS[:300], TOKENS[300] + 1, *TOKENS[301:]]
    assert chunk_keys(later, NS, 256)[0] == keys[0]
    assert chunk_keys(later, NS, 256)[1:] != keys[1:]


def test_partial_chunk_semantics() -> None:
    full = chunk_keys(TOKENS, NS, 256, partial=True)
    assert len(full) == 4 and chunk_spans(1000, 256, partial=True)[-1] == (768, 1000)
    # The same prompt again finds its partial chunk...
    assert chunk_keys(TOKENS, NS, 256, partial=True) == full
    # ...a longer prompt sharing those tokens does not (its chunk there is full or longer)...
    longer = chunk_keys([*TOKENS, 1, 2, 3], NS, 256, partial=True)
    assert longer[:3] == full[:3] and longer[3] != full[3]
    # ...and a partial chunk never equals the full chunk with the same leading tokens.
    exact = chunk_keys(TOKENS[:768] + TOKENS[:256], NS, 256)
    prefix = chunk_keys(TOKENS[:768] + TOKENS[:255], NS, 256, partial=True)
    assert exact[3] != prefix[3]


def test_token_containers_agree() -> None:
    expected = chunk_keys(TOKENS, NS, 256)
    for tokens in (
        tuple(TOKENS),
        np.array(TOKENS, dtype=np.int64),
        np.array(TOKENS, dtype=np.uint32),
        np.array(TOKENS, dtype=np.int32)[::1],
        torch.tensor(TOKENS),
        torch.tensor(TOKENS, dtype=torch.int32),
    ):
        assert chunk_keys(tokens, NS, 256) == expected, type(tokens)
    strided = np.array([TOKENS, TOKENS]).T[:, 0]  # non-contiguous view
    assert chunk_keys(strided, NS, 256) == expected


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        ([1, 2.5], "integers"),
        ([1, -1], "-1 is out of range"),
        ([2**32], "out of range"),
        ("abc", "sequence of integers"),
        (b"\x00\x01\x02\x03", "sequence of integers"),
        (np.array([1.0, 2.0]), "dtype float64"),
        (np.array([[1, 2]]), "one-dimensional"),
        (np.array([1, -5]), "-5 is out of range"),
        (torch.tensor([1.0]), "dtype torch.float32"),
        ([1, None], "integers"),
    ],
)
def test_bad_tokens_raise_value_error(tokens: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        chunk_keys(tokens, NS, 4)


def test_keys_one_at_a_time_are_the_same_keys() -> None:
    tokens = list(range(37))
    for partial in (False, True):
        stream = iter_chunk_keys(tokens, NS, 4, partial)
        assert list(stream) == chunk_keys(tokens, NS, 4, partial)
    assert len(chunk_keys(tokens, NS, 4, partial=True)) == 10
    with pytest.raises(ValueError, match="-1 is out of range"):
        iter_chunk_keys([1, -1], NS, 4)  # at the call, before a key is taken
    with pytest.raises(ValueError, match="16 bytes"):
        iter_chunk_keys([1, 2], b"short", 1)


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="chunk_size must be > 0"):
        chunk_spans(10, 0)
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        chunk_spans(-1, 4)
    with pytest.raises(ValueError, match="16 bytes"):
        chunk_keys([1, 2], b"short", 1)


def test_token_bytes_are_canonical_little_endian() -> None:
    assert bytes(token_bytes([1, 256])) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert bytes(token_bytes(np.array([1, 256], dtype=">i8"))) == bytes(token_bytes([1, 256]))
