"""The arithmetic behind ``kvstack plan``: KV footprint, load versus recompute, break-evens.

Models, kept deliberately simple so every figure can be checked by hand:

- KV bytes per token ``b = 2 x layers x kv_heads x head_dim x dtype_bytes``;
- HBM KV capacity per engine ``(hbm x utilization - weights - reserve) / b`` tokens;
- recomputing (prefilling) tokens ``[s, e)`` costs ``(e - s) / tps + attn x (e^2 - s^2)`` seconds
  (``attn`` models attention's quadratic growth; 0 by default);
- loading ``n`` tokens from a tier costs ``latency + n x b / bandwidth``, where a tier below
  DRAM also crosses PCIe (its bandwidth is the smaller of the two);
- with an LRU cache and reuse spread evenly over a working set of ``W`` tokens, a reused
  prefix is found in the first ``C`` tokens of cache capacity with probability ``min(1, C/W)``;
  each tier holds the next slice of capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from kvstack.section import Section

__all__ = [
    "Hardware",
    "Option",
    "PlanModelShape",
    "PlanResult",
    "TierFigures",
    "WorkloadShape",
    "break_even_tokens",
    "evaluate",
]

GIB = 1 << 30


class PlanModelShape(Section):
    num_layers: int = Field(default=32, gt=0, description="transformer layers")
    num_kv_heads: int = Field(default=8, gt=0, description="KV heads (all TP ranks)")
    head_dim: int = Field(default=128, gt=0, description="head dimension")
    dtype_bytes: float = Field(default=2, gt=0, description="bytes per KV element (bf16: 2)")
    weights_gib: float = Field(default=15.0, ge=0, description="weights held in HBM")

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


class Hardware(Section):
    hbm_gib: float = Field(default=80.0, gt=0, description="accelerator memory per engine")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="vLLM's share")
    reserve_gib: float = Field(default=2.0, ge=0, description="activations and other buffers")
    dram_gib: float = Field(default=0.0, ge=0, description="host memory for a cpu:// tier")
    disk_gib: float = Field(default=0.0, ge=0, description="local disk for a file:// tier")
    remote_gib: float = Field(default=0.0, ge=0, description="shared remote tier capacity")
    pcie_gbps: float = Field(default=25.0, gt=0, description="host-to-GPU GB/s (effective)")
    disk_gbps: float = Field(default=5.0, gt=0, description="disk read GB/s")
    network_gbps: float = Field(default=10.0, gt=0, description="remote tier GB/s")
    dram_latency_s: float = Field(default=0.0002, ge=0, description="fixed cost of a CPU load")
    disk_latency_s: float = Field(default=0.001, ge=0, description="fixed cost of a disk load")
    network_latency_s: float = Field(default=0.005, ge=0, description="fixed cost, remote load")
    prefill_tokens_per_s: float = Field(default=16000.0, gt=0, description="prefill throughput")
    attention_s_per_token2: float = Field(
        default=0.0, ge=0, description="quadratic prefill term: seconds per token squared"
    )
    num_engines: int = Field(default=1, ge=1, description="engines in the fleet")


class WorkloadShape(Section):
    prompt_tokens: int = Field(default=4000, gt=0, description="mean prompt length")
    reuse_fraction: float = Field(
        default=0.8, ge=0, le=1, description="share of each prompt that is a reused prefix"
    )
    working_set_tokens: int = Field(
        default=2_000_000, gt=0, description="distinct reused prefix tokens across the workload"
    )
    request_rate: float = Field(default=10.0, gt=0, description="requests per second (fleet)")
    routing: str = Field(
        default="cache-aware",
        pattern="^(cache-aware|random)$",
        description="cache-aware: each engine sees W / engines; random: every engine sees W",
    )


@dataclass(frozen=True, slots=True)
class TierFigures:
    name: str
    capacity_tokens: float  # per engine; fleet-wide for the shared remote tier
    latency_s: float
    bytes_per_s: float
    shared: bool = False

    def load_s(self, num_tokens: float, kv_bytes_per_token: float) -> float:
        return self.latency_s + num_tokens * kv_bytes_per_token / self.bytes_per_s


def prefill_s(hw: Hardware, start: float, end: float) -> float:
    """Seconds to prefill tokens ``[start, end)`` of a prompt."""
    return (end - start) / hw.prefill_tokens_per_s + hw.attention_s_per_token2 * (end**2 - start**2)


def break_even_tokens(tier: TierFigures, hw: Hardware, kv_bytes_per_token: float) -> float | None:
    """The prefix length above which loading it beats recomputing it: 0 when loading always
    wins, None when it never does. Solves ``latency + n b / bw = n / tps + attn n^2``."""
    a = hw.attention_s_per_token2
    slope = 1 / hw.prefill_tokens_per_s - kv_bytes_per_token / tier.bytes_per_s
    c = -tier.latency_s
    if a == 0:
        if slope <= 0:
            return None
        return tier.latency_s / slope
    disc = slope * slope - 4 * a * c
    return max(0.0, (-slope + math.sqrt(disc)) / (2 * a))


def tiers(model: PlanModelShape, hw: Hardware) -> list[TierFigures]:
    b = model.kv_bytes_per_token
    hbm = max(0.0, hw.hbm_gib * hw.gpu_memory_utilization - model.weights_gib - hw.reserve_gib)
    pcie = hw.pcie_gbps * 1e9
    disk = min(pcie, hw.disk_gbps * 1e9)
    network = min(pcie, hw.network_gbps * 1e9)
    return [
        TierFigures("hbm", hbm * GIB / b, 0.0, math.inf),
        TierFigures("cpu", hw.dram_gib * GIB / b, hw.dram_latency_s, pcie),
        TierFigures("disk", hw.disk_gib * GIB / b, hw.disk_latency_s, disk),
        TierFigures("remote", hw.remote_gib * GIB / b, hw.network_latency_s, network, shared=True),
    ]


@dataclass(frozen=True, slots=True)
class Option:
    """One configuration: which tiers exist, where reused prefixes are found, what it costs."""

    name: str
    tiers: tuple[str, ...]
    hit_fractions: dict[str, float]  # tier -> share of reused prefixes found there
    miss_fraction: float
    prefill_s_per_request: float  # expected time to first token's compute/load part
    gpu_busy_fraction: float  # prefill seconds per second per engine (> 1: overloaded)


@dataclass(frozen=True, slots=True)
class PlanResult:
    kv_bytes_per_token: float
    working_set_gib: float
    per_engine_working_set_tokens: float
    tiers: list[TierFigures]
    break_even: dict[str, float | None]
    options: list[Option]
    cpu_offload_pays_above_tokens: float | None  # per-engine working set where it starts


def _option(
    name: str,
    chosen: tuple[str, ...],
    figures: list[TierFigures],
    hw: Hardware,
    wl: WorkloadShape,
    per_engine_ws: float,
    b: float,
) -> Option:
    """Tiers are inclusive (write-through): each holds the most recent prefixes that fit, and
    a hit is served by the fastest tier holding it."""
    reused = wl.prompt_tokens * wl.reuse_fraction
    fractions: dict[str, float] = {}
    best = 0.0
    expected = 0.0
    for tier in figures:
        if tier.name not in chosen:
            continue
        ws = wl.working_set_tokens if tier.shared else per_engine_ws
        reach = min(1.0, tier.capacity_tokens / ws)
        share = max(0.0, reach - best)
        best = max(best, reach)
        fractions[tier.name] = share
        load = 0.0 if tier.name == "hbm" else tier.load_s(reused, b)
        expected += share * (load + prefill_s(hw, reused, wl.prompt_tokens))
    miss = 1.0 - best
    expected += miss * prefill_s(hw, 0, wl.prompt_tokens)
    busy = wl.request_rate / hw.num_engines * expected
    return Option(name, chosen, fractions, miss, expected, busy)


def evaluate(model: PlanModelShape, hw: Hardware, wl: WorkloadShape) -> PlanResult:
    b = model.kv_bytes_per_token
    figures = tiers(model, hw)
    per_engine_ws = wl.working_set_tokens / (hw.num_engines if wl.routing == "cache-aware" else 1)
    options = [_option("vLLM prefix cache only", ("hbm",), figures, hw, wl, per_engine_ws, b)]
    for extra, label in (
        (("cpu",), "+ cpu tier"),
        (("cpu", "disk"), "+ cpu + disk tiers"),
        (("cpu", "disk", "remote"), "+ cpu + disk + shared remote"),
    ):
        if all(next(t for t in figures if t.name == n).capacity_tokens > 0 for n in extra):
            options.append(_option(label, ("hbm", *extra), figures, hw, wl, per_engine_ws, b))
    cpu = figures[1]
    offload = figures[0].capacity_tokens if break_even_tokens(cpu, hw, b) is not None else None
    return PlanResult(
        kv_bytes_per_token=b,
        working_set_gib=wl.working_set_tokens * b / GIB,
        per_engine_working_set_tokens=per_engine_ws,
        tiers=figures,
        break_even={t.name: break_even_tokens(t, hw, b) for t in figures[1:]},
        options=options,
        cpu_offload_pays_above_tokens=offload,
    )
