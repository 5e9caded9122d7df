"""How long one engine step takes, in simulated seconds.

A step runs one forward pass over the scheduled tokens of every running request::

    step_s = step_base_s                                  (weights read; every step)
           + prefill_tokens / prefill_tokens_per_s        (uncached prompt tokens computed)
           + decode_seqs * decode_per_seq_s               (one token each)
           + decode_context_tokens * decode_per_context_token_s   (attention reads)
           + lora_s                                       (adapters brought into slots)
           + transfer_tokens * kv_bytes_per_token / tier_bytes_per_s   (KV loaded from a tier)

So an idle engine's time to first token for an uncached P-token prompt is
``step_base_s + P / prefill_tokens_per_s`` (when P fits the step's token budget) and its
inter-token latency at batch size 1 is ``step_base_s + decode_per_seq_s + context * per-token``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstack.sim.config import SimConfig

__all__ = ["StepCost", "step_seconds"]


@dataclass(slots=True)
class StepCost:
    prefill_tokens: int = 0
    decode_seqs: int = 0
    decode_context_tokens: int = 0
    lora_s: float = 0.0
    transfer_tokens: int = 0


def step_seconds(config: SimConfig, cost: StepCost) -> float:
    return (
        config.step_base_s
        + cost.prefill_tokens / config.prefill_tokens_per_s
        + cost.decode_seqs * config.decode_per_seq_s
        + cost.decode_context_tokens * config.decode_per_context_token_s
        + cost.lora_s
        + cost.transfer_tokens * config.kv_bytes_per_token / config.tier_bytes_per_s
    )
