"""Configuration of the KV cache layer (the ``kv`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvstack.section import Section

__all__ = ["KVConfig", "ModelShape"]


class ModelShape(Section):
    """The per-token KV shape of the model; stores of any other shape are rejected."""

    num_layers: int = Field(gt=0, description="transformer layers holding KV")
    num_kv_heads: int = Field(gt=0, description="KV heads per layer (per TP rank)")
    head_dim: int = Field(gt=0, description="dimension of one head")


class KVConfig(Section):
    model: str = Field(
        default="",
        description="model fingerprint: name plus revision or weights digest (llama-3-8b@abc123)",
    )
    chunk_size: int = Field(
        default=256,
        gt=0,
        le=1 << 20,
        description="tokens per chunk (a multiple of the engine block size)",
    )
    tiers: list[str] = Field(
        default_factory=lambda: ["cpu://?size=1GiB"],
        description="tier URLs, fastest first: cpu://?size=8GiB, file:///var/kv?size=100GiB, "
        "redis://host:6379/0, s3://bucket/prefix, peer://",
    )
    save_partial_chunks: bool = Field(
        default=False,
        description="also store a trailing chunk shorter than chunk_size; it is matched only by a "
        "prompt ending with exactly the same partial chunk",
    )
    write_policy: Literal["write-through", "write-back"] = Field(
        default="write-through",
        description="write-through: stores go to every tier; write-back: to the first tier, "
        "reaching the next one when evicted",
    )
    promote_on_hit: bool = Field(
        default=True, description="copy hits in slow tiers into faster tiers"
    )
    admission_threshold: int = Field(
        default=1, ge=1, description="store a chunk only once it was requested this many times"
    )
    kv_dtype: str | None = Field(
        default=None, description="KV dtype, e.g. bfloat16; part of the key namespace; None: auto"
    )
    model_shape: ModelShape | None = Field(
        default=None, description="expected KV shape; None: fixed by the first store"
    )
    tp_rank: int = Field(
        default=0, ge=0, description="tensor-parallel rank (part of the namespace)"
    )
    tp_size: int = Field(
        default=1, ge=1, description="tensor-parallel size (part of the namespace)"
    )
    layout_version: int = Field(default=1, ge=1, description="bump when the chunk layout changes")
