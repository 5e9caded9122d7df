"""Configuration of the ``sim`` section: one simulated vLLM engine.

Times are in *simulated* seconds: the engine runs ``time_scale`` times faster than the wall
clock, so ``prefill_tokens_per_s`` and the step costs describe the modelled GPU, not this CPU.
The defaults sketch an 8B model on one large GPU: ~16K prefill tokens/s, an 8 ms forward pass,
and 128 KiB of KV per token (Llama-3-8B in bf16: 32 layers x 8 KV heads x 128 x 2 x 2 bytes).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from kvstack.section import Section

__all__ = ["SimConfig"]


class SimConfig(Section):
    # -- what it serves --------------------------------------------------------------------
    model: str = Field(default="sim-model", min_length=1, description="served model name")
    max_model_len: int = Field(
        default=32768,
        gt=0,
        description="context limit (prompt + output tokens); when not given, 32768 or the KV "
        "capacity if smaller",
    )
    vocab_size: int = Field(
        default=32000, ge=64, le=1 << 31, description="token ids of the simple tokenizer"
    )
    # -- paged KV cache --------------------------------------------------------------------
    block_size: int = Field(default=16, gt=0, le=4096, description="tokens per KV block")
    num_blocks: int = Field(default=8192, gt=0, description="KV blocks in the engine")
    enable_prefix_caching: bool = Field(default=True, description="reuse cached prefix blocks")
    hash_seed: str = Field(
        default="vllm-none-hash",
        description="seed of the block hash chain; vLLM's sha256_cbor default when "
        "PYTHONHASHSEED is unset (set it to PYTHONHASHSEED's value to match such an engine)",
    )
    # -- scheduler -------------------------------------------------------------------------
    max_num_seqs: int = Field(default=256, gt=0, description="max requests in a batch")
    max_num_batched_tokens: int = Field(
        default=8192, gt=0, description="token budget of one step (chunked prefill)"
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs", description="fcfs, or priority (request field 'priority', lower first)"
    )
    # -- timing model (simulated seconds) ---------------------------------------------------
    prefill_tokens_per_s: float = Field(
        default=16000.0, gt=0, description="prefill throughput for uncached prompt tokens"
    )
    step_base_s: float = Field(
        default=0.008, ge=0, description="fixed cost of one forward pass (weights read)"
    )
    decode_per_seq_s: float = Field(
        default=0.0001, ge=0, description="added step time per decoding sequence"
    )
    decode_per_context_token_s: float = Field(
        default=1e-8, ge=0, description="added step time per KV token read by decoding sequences"
    )
    time_scale: float = Field(
        default=1.0, gt=0, le=10000, description="simulated seconds per wall-clock second"
    )
    catch_up_wall_s: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description="a step that ends up to this many wall seconds late (a GC pause, a busy "
        "host) is caught up without shifting simulated time; later than that, time shifts "
        "and the delay counts as lag",
    )
    stream_interval: int = Field(
        default=1, ge=1, description="tokens per streamed chunk (vLLM's --stream-interval)"
    )
    # -- LoRA ------------------------------------------------------------------------------
    enable_lora: bool = Field(default=False, description="serve LoRA adapters")
    max_loras: int = Field(default=1, ge=1, description="adapter slots usable in one batch")
    max_cpu_loras: int | None = Field(
        default=None, ge=1, description="adapters kept in host memory (None: max_loras)"
    )
    lora_load_s: float = Field(
        default=0.2, ge=0, description="time to load an adapter from storage into host memory"
    )
    lora_activate_s: float = Field(
        default=0.01, ge=0, description="time to copy a host-memory adapter into a slot"
    )
    lora_check_path: bool = Field(
        default=True, description="reject /v1/load_lora_adapter when lora_path does not exist"
    )
    # -- KV events ---------------------------------------------------------------------------
    kv_events_endpoint: str | None = Field(
        default=None, description="ZMQ PUB endpoint for KV events, e.g. tcp://*:5557"
    )
    kv_events_replay_endpoint: str | None = Field(
        default=None, description="ZMQ ROUTER endpoint answering replay requests"
    )
    kv_events_topic: str = Field(default="", description="topic frame of every event message")
    kv_events_buffer_steps: int = Field(
        default=10000, gt=0, description="event batches kept for replay"
    )
    # -- optional kvstack tier ---------------------------------------------------------------
    kv_tiers: list[str] = Field(
        default_factory=list,
        description="kvstack tier URLs; a prompt chunk found there costs a transfer, not a "
        "prefill (e.g. file:///tmp/kv?size=1GiB shared by several engines)",
    )
    kv_chunk_size: int = Field(default=256, gt=0, description="tier chunk size in tokens")
    kv_bytes_per_token: int = Field(
        default=131072, gt=0, description="modelled KV bytes per token (transfer time)"
    )
    tier_bytes_per_s: float = Field(
        default=10e9, gt=0, description="modelled tier-to-GPU bandwidth"
    )
    # -- access ------------------------------------------------------------------------------
    api_key: SecretStr | None = Field(
        default=None,
        description="vLLM's --api-key: /v1 routes need 'Authorization: Bearer KEY' (the "
        "sim-engine command also reads VLLM_API_KEY, as vLLM does)",
    )
    # -- output ------------------------------------------------------------------------------
    seed: int = Field(default=0, description="seed of the synthetic output tokens")

    @model_validator(mode="before")
    @classmethod
    def _default_max_model_len(cls, data: Any) -> Any:
        """Without an explicit max_model_len, a small KV cache lowers the context limit."""
        if isinstance(data, dict) and data.get("max_model_len") is None:
            fields = cls.model_fields
            blocks = data.get("num_blocks", fields["num_blocks"].default)
            size = data.get("block_size", fields["block_size"].default)
            if isinstance(blocks, int) and isinstance(size, int) and blocks > 0 and size > 0:
                data = {**data, "max_model_len": min(32768, blocks * size)}
        return data

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"block_size ({self.block_size})"
            )
        capacity = self.num_blocks * self.block_size
        if self.max_model_len > capacity:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must be <= the KV capacity num_blocks x "
                f"block_size ({capacity} tokens), so that any single request fits"
            )
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        return self

    @property
    def cpu_lora_capacity(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
