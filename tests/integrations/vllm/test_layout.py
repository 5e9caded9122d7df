"""Which vLLM KV layouts kvstack can restore: one full-attention group only."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

spec_module = pytest.importorskip("vllm.v1.kv_cache_interface")

from kvstack.integrations.vllm.layout import unrestorable_reason  # noqa: E402


def full() -> Any:
    return spec_module.FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16
    )


def sliding() -> Any:
    return spec_module.SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16, sliding_window=128
    )


def config(*specs: Any) -> Any:
    groups = [SimpleNamespace(layer_names=[f"l{i}"], kv_cache_spec=s) for i, s in enumerate(specs)]
    return SimpleNamespace(kv_cache_groups=groups)


def test_one_full_attention_group_is_restorable() -> None:
    assert unrestorable_reason(config(full())) == ""


def test_hybrid_and_windowed_layouts_are_not() -> None:
    hybrid = unrestorable_reason(config(full(), sliding()))
    assert "2 KV cache groups (full attention, SlidingWindow)" in hybrid
    assert "--disable-hybrid-kv-cache-manager" in hybrid
    assert "SlidingWindow" in unrestorable_reason(config(sliding()))
