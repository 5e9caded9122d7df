"""The ``lora-zipf`` workload of the adapter-cache benchmark, as the LoRA issue specifies it.

Adapters belong to tenant tiers that hold a share of the adapters and a share of the traffic
(default: platinum 2 % / 30 %, gold 18 % / 40 %, standard 80 % / 30 %); within a tier,
popularity follows Zipf with exponent ``s``. Arrivals are Poisson; each request is interactive
with probability ``interactive_fraction``, else background. Adapter ranks vary (8 to 64), so
their modelled sizes, and with them fetch times, vary too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ISSUE_TIERS", "Arrival", "BenchAdapter", "TierMix", "make_adapters", "make_arrivals"]


@dataclass(frozen=True, slots=True)
class TierMix:
    name: str
    adapter_fraction: float
    traffic_share: float


ISSUE_TIERS = (
    TierMix("platinum", 0.02, 0.30),
    TierMix("gold", 0.18, 0.40),
    TierMix("standard", 0.80, 0.30),
)
RANKS = (8, 16, 32, 64)
RANK_WEIGHTS = (0.3, 0.4, 0.2, 0.1)


@dataclass(frozen=True, slots=True)
class BenchAdapter:
    adapter_id: str
    tier: str
    rank: int
    weight: float  # probability that a request is for this adapter


@dataclass(frozen=True, slots=True)
class Arrival:
    t_s: float  # simulated seconds from the start
    adapter: int  # index into the adapter list
    interactive: bool
    user: int


def make_adapters(
    num_adapters: int, zipf_s: float, tiers: tuple[TierMix, ...] = ISSUE_TIERS, seed: int = 0
) -> list[BenchAdapter]:
    rng = random.Random(seed)
    adapters: list[BenchAdapter] = []
    for tier in tiers:
        count = max(1, round(num_adapters * tier.adapter_fraction))
        zipf = [1.0 / (i + 1) ** zipf_s for i in range(count)]
        total = sum(zipf)
        for i in range(count):
            rank = rng.choices(RANKS, RANK_WEIGHTS)[0]
            weight = tier.traffic_share * zipf[i] / total
            adapters.append(BenchAdapter(f"{tier.name}-{i:04d}", tier.name, rank, weight))
    return adapters


def make_arrivals(
    adapters: list[BenchAdapter],
    num_requests: int,
    rate_per_s: float,
    interactive_fraction: float,
    seed: int = 1,
) -> list[Arrival]:
    rng = random.Random(seed)
    picks = rng.choices(range(len(adapters)), [a.weight for a in adapters], k=num_requests)
    t, out = 0.0, []
    for pick in picks:
        t += rng.expovariate(rate_per_s)
        out.append(Arrival(t, pick, rng.random() < interactive_fraction, rng.randrange(10_000)))
    return out
