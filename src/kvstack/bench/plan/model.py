"""The inputs of ``kvstack plan`` and the arithmetic every figure starts from.

Kept simple enough to check by hand:

- KV bytes per token ``b = 2 x layers x kv_heads x head_dim x dtype_bytes``;
- HBM KV capacity per engine ``(hbm x utilization - weights - reserve) / b`` tokens, of which
  running requests hold ``hbm_kv_usage`` (what ``vllm:kv_cache_usage_perc`` shows); the rest
  keeps cached prefixes;
- recomputing (prefilling) tokens ``[s, e)`` costs ``(e - s) / tps + attn x (e^2 - s^2)``
  seconds (``attn`` models attention's quadratic growth; 0 by default);
- loading ``n`` tokens from a tier costs ``fixed + latency + n x b / bandwidth``: ``fixed`` is
  the per-request cost of any load (``load_fixed_s``: lookup, planning, copy launch, which
  ``kvstack plan --measure-fixed-costs`` measures for kvstack on this host; plus
  ``load_wait_s``: the engine step an asynchronous load waits), ``latency`` the tier's first
  byte; a tier below host memory also crosses PCIe (its bandwidth is the smaller of the two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from kvstack.section import Section

__all__ = [
    "GIB",
    "Hardware",
    "PlanModelShape",
    "TierFigures",
    "WorkloadShape",
    "break_even_tokens",
    "hbm_capacity_tokens",
    "prefill_s",
    "tier_figures",
]

GIB = 1 << 30


class PlanModelShape(Section):
    num_layers: int = Field(default=32, gt=0, description="transformer layers")
    num_kv_heads: int = Field(default=8, gt=0, description="KV heads (all TP ranks)")
    head_dim: int = Field(default=128, gt=0, description="head dimension")
    dtype_bytes: float = Field(default=2, gt=0, description="bytes per KV element (bf16 2, fp8 1)")
    weights_gib: float = Field(default=15.0, ge=0, description="weights held in HBM")

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


class Hardware(Section):
    hbm_gib: float = Field(default=80.0, gt=0, description="accelerator memory per engine")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="vLLM's share")
    reserve_gib: float = Field(default=2.0, ge=0, description="activations and other buffers")
    accelerator: Literal["gpu", "cpu"] = Field(
        default="gpu",
        description="gpu: CUDA or XPU (vLLM's native CPU offload runs); cpu: vLLM's CPU build "
        "(it refuses native offloading)",
    )
    dram_gib: float = Field(default=64.0, ge=0, description="host memory for offloaded KV")
    disk_gib: float = Field(default=0.0, ge=0, description="local disk for a file:// tier")
    remote_gib: float = Field(default=0.0, ge=0, description="shared remote tier capacity")
    pcie_gbps: float = Field(default=25.0, gt=0, description="host-to-GPU GB/s (effective)")
    disk_gbps: float = Field(default=5.0, gt=0, description="disk read GB/s")
    network_gbps: float = Field(default=10.0, gt=0, description="remote tier read GB/s")
    dram_latency_s: float = Field(default=0.0002, ge=0, description="first byte, host memory")
    disk_latency_s: float = Field(default=0.001, ge=0, description="first byte, local disk")
    network_latency_s: float = Field(default=0.005, ge=0, description="first byte, remote tier")
    load_fixed_s: float = Field(
        # kvstack's path measured 0.09 ms (median) on the 2-core development host with
        # `kvstack plan --measure-fixed-costs`; rounded up for the copy launches of a GPU.
        default=0.0001,
        ge=0,
        description="per-request fixed cost of a load: keys, lookup, the scheduler-to-worker "
        "hop, copy launch (--measure-fixed-costs measures kvstack's on this host)",
    )
    load_wait_s: float = Field(
        default=0.015,
        ge=0,
        description="what a request waits for its asynchronous load: about one engine step of "
        "a loaded engine (its inter-token latency)",
    )
    prefill_tokens_per_s: float = Field(default=16000.0, gt=0, description="prefill throughput")
    attention_s_per_token2: float = Field(
        default=0.0, ge=0, description="quadratic prefill term: seconds per token squared"
    )
    num_engines: int = Field(default=1, ge=1, description="engines in the fleet")

    @property
    def fixed_load_s(self) -> float:
        """What any load costs before its bytes move."""
        return self.load_fixed_s + self.load_wait_s


class WorkloadShape(Section):
    prompt_tokens: int = Field(default=4000, gt=0, description="mean prompt (context) length")
    reuse_fraction: float = Field(
        default=0.8, ge=0, le=1, description="share of each prompt that is a reused prefix"
    )
    output_tokens: int = Field(default=200, ge=0, description="mean generated tokens")
    prefix_groups: int = Field(
        default=500,
        ge=1,
        description="distinct reused prefixes (tenants' system prompts, documents), requested "
        "evenly; the working set is prefix_groups x reused tokens",
    )
    working_set_tokens: int | None = Field(
        default=None,
        gt=0,
        description="distinct reused prefix tokens; when given, prefix_groups = this / reused "
        "tokens per prompt",
    )
    request_rate: float = Field(default=10.0, gt=0, description="requests per second (fleet)")
    requests_per_hour: float | None = Field(
        default=None, gt=0, description="requests per hour (fleet); overrides request_rate"
    )
    routing: str = Field(
        default="cache-aware",
        pattern="^(cache-aware|random)$",
        description="cache-aware: each prefix is served by one engine; random: by every engine",
    )
    hbm_kv_usage: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="share of the HBM KV cache that running requests hold "
        "(vllm:kv_cache_usage_perc); the rest keeps cached prefixes",
    )
    preemptions_per_hour: float = Field(
        default=0.0, ge=0, description="preempted requests per hour (vllm:num_preemptions_total)"
    )
    other_traffic_tokens_per_s: float = Field(
        default=0.0,
        ge=0,
        description="tokens per second per engine that other workloads compute: their KV "
        "competes with this workload's prefixes for every cache",
    )

    @property
    def rate_per_s(self) -> float:
        return self.requests_per_hour / 3600 if self.requests_per_hour else self.request_rate

    @property
    def reused_tokens(self) -> float:
        return self.prompt_tokens * self.reuse_fraction

    @property
    def groups(self) -> float:
        """Distinct reused prefixes."""
        if self.working_set_tokens is not None and self.reused_tokens > 0:
            return max(1.0, self.working_set_tokens / self.reused_tokens)
        return float(self.prefix_groups)

    @property
    def working_set(self) -> float:
        return self.groups * self.reused_tokens


@dataclass(frozen=True, slots=True)
class TierFigures:
    name: str
    capacity_tokens: float  # per engine; fleet-wide for the shared remote tier
    latency_s: float
    bytes_per_s: float
    shared: bool = False

    def load_s(self, num_tokens: float, kv_bytes_per_token: float, fixed_s: float = 0.0) -> float:
        return fixed_s + self.latency_s + num_tokens * kv_bytes_per_token / self.bytes_per_s


def prefill_s(hw: Hardware, start: float, end: float) -> float:
    """Seconds to prefill tokens ``[start, end)`` of a prompt."""
    return (end - start) / hw.prefill_tokens_per_s + hw.attention_s_per_token2 * (end**2 - start**2)


def break_even_tokens(
    tier: TierFigures, hw: Hardware, kv_bytes_per_token: float, fixed_s: float = 0.0
) -> float | None:
    """The shortest prefix for which loading beats recomputing it: 0 when loading always wins,
    None when it never does. Solves ``fixed + latency + n b / bw = n / tps + attn n^2``."""
    a = hw.attention_s_per_token2
    slope = 1 / hw.prefill_tokens_per_s - kv_bytes_per_token / tier.bytes_per_s
    cost = fixed_s + tier.latency_s
    if a == 0:
        return None if slope <= 0 else cost / slope
    return max(0.0, (-slope + math.sqrt(slope * slope + 4 * a * cost)) / (2 * a))


def hbm_capacity_tokens(model: PlanModelShape, hw: Hardware) -> float:
    """The KV cache's size in tokens, per engine."""
    kv_gib = hw.hbm_gib * hw.gpu_memory_utilization - model.weights_gib - hw.reserve_gib
    return max(0.0, kv_gib) * GIB / model.kv_bytes_per_token


def tier_figures(model: PlanModelShape, hw: Hardware) -> dict[str, TierFigures]:
    b = model.kv_bytes_per_token
    pcie = hw.pcie_gbps * 1e9
    return {
        "hbm": TierFigures("hbm", hbm_capacity_tokens(model, hw), 0.0, math.inf),
        "cpu": TierFigures("cpu", hw.dram_gib * GIB / b, hw.dram_latency_s, pcie),
        "disk": TierFigures(
            "disk", hw.disk_gib * GIB / b, hw.disk_latency_s, min(pcie, hw.disk_gbps * 1e9)
        ),
        "remote": TierFigures(
            "remote",
            hw.remote_gib * GIB / b,
            hw.network_latency_s,
            min(pcie, hw.network_gbps * 1e9),
            shared=True,
        ),
    }
