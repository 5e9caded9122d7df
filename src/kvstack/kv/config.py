"""Configuration of the KV cache layer (the ``kv`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvstack.kv.format import DTYPES
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
    write_tiers: list[str] | None = Field(
        default=None,
        description="names of the tiers that receive stores (scheme, or scheme plus position "
        "when repeated, e.g. ['cpu', 'file']); overrides write_policy; None: by write_policy",
    )
    promote_on_hit: bool = Field(
        default=True, description="copy hits in slow tiers into faster tiers"
    )
    admission_threshold: int = Field(
        default=1, ge=1, description="store a chunk only once it was requested this many times"
    )
    kv_dtype: str | None = Field(
        default=None,
        description="KV dtype, e.g. bfloat16; part of the key namespace; None: any (fixed by "
        "the first store)",
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

    @field_validator("kv_dtype")
    @classmethod
    def _known_dtype(cls, value: str | None) -> str | None:
        if value is not None and value not in DTYPES:
            raise ValueError(f"unsupported KV dtype {value!r}; supported: {', '.join(DTYPES)}")
        return value

    @field_validator("tiers")
    @classmethod
    def _known_schemes(cls, urls: list[str]) -> list[str]:
        from kvstack.kv.tiers import TIERS, parse_tier_url

        if not urls:
            raise ValueError("at least one tier URL is needed, e.g. cpu://?size=1GiB")
        for url in urls:
            scheme = parse_tier_url(url).scheme
            if scheme not in TIERS:
                raise ValueError(
                    f"unknown tier scheme {scheme!r} in {url!r}; known: {', '.join(TIERS.names())}"
                )
        return urls

    @model_validator(mode="after")
    def _rank_in_range(self) -> KVConfig:
        if self.tp_rank >= self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} is out of range [0, tp_size={self.tp_size})")
        return self
