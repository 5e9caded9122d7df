"""``lora-zipf``: requests for LoRA adapters in tenant tiers, Zipf popularity within a tier.

The workload as the LoRA issue specifies it. Adapters belong to tenant tiers that hold a share
of the adapters and a share of the traffic (default: platinum 2 % / 30 %, gold 18 % / 40 %,
standard 80 % / 30 %); a tier of N adapters gets ``round(N * adapter_fraction)`` of them, at
least one (so a small N may give a few more). Within a tier, popularity follows Zipf with
exponent ``zipf_s``. Adapter ranks vary (8 to 64), so their modelled sizes, and with them fetch
times, vary too. A request is interactive with probability ``interactive_fraction``, else
background.

One definition, two consumers:

- :class:`LoRAZipf`, the registered workload (``kvstack bench serve``, ``bench compare``):
  request specs one at a time; interactive ones have priority ``critical``, background ones
  ``sheddable`` and longer answers; each adapter has its own system prompt, so KV reuse stays
  within an adapter. The tenant of a request is its adapter's tier.
- ``kvstack bench lora``: :func:`make_adapters` and a Poisson arrival stream,
  :func:`make_arrivals`, which its arms replay in simulated time.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from pydantic import ConfigDict, Field, field_validator

from kvstack.bench.workloads.base import RequestSpec, Workload, WorkloadParams
from kvstack.section import Section

__all__ = [
    "ISSUE_TIERS",
    "LoRAZipf",
    "LoRAZipfAdapter",
    "LoRAZipfArrival",
    "LoRAZipfParams",
    "TierMix",
    "make_adapters",
    "make_arrivals",
]

RANKS = (8, 16, 32, 64)
RANK_WEIGHTS = (0.3, 0.4, 0.2, 0.1)


class TierMix(Section):
    """A tenant tier: its share of the adapters and of the traffic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="tier name; also the tenant of its requests")
    adapter_fraction: float = Field(ge=0, le=1, description="share of the adapters")
    traffic_share: float = Field(ge=0, le=1, description="share of the requests")


ISSUE_TIERS = (
    TierMix(name="platinum", adapter_fraction=0.02, traffic_share=0.30),
    TierMix(name="gold", adapter_fraction=0.18, traffic_share=0.40),
    TierMix(name="standard", adapter_fraction=0.80, traffic_share=0.30),
)


@dataclass(frozen=True, slots=True)
class LoRAZipfAdapter:
    adapter_id: str  # <tier>-<index in the tier, 0 the most popular>
    tier: str
    rank: int
    weight: float  # probability that a request is for this adapter


@dataclass(frozen=True, slots=True)
class LoRAZipfArrival:
    t_s: float  # simulated seconds from the start
    adapter: int  # index into the adapter list
    interactive: bool
    user: int


def make_adapters(
    num_adapters: int, zipf_s: float, tiers: tuple[TierMix, ...] = ISSUE_TIERS, seed: int = 0
) -> list[LoRAZipfAdapter]:
    """The adapters, tier by tier, each with its rank (drawn from ``seed``) and weight."""
    rng = random.Random(seed)
    adapters: list[LoRAZipfAdapter] = []
    for tier in tiers:
        count = max(1, round(num_adapters * tier.adapter_fraction))
        zipf = [1.0 / (i + 1) ** zipf_s for i in range(count)]
        total = sum(zipf)
        for i in range(count):
            rank = rng.choices(RANKS, RANK_WEIGHTS)[0]
            weight = tier.traffic_share * zipf[i] / total
            adapters.append(LoRAZipfAdapter(f"{tier.name}-{i:04d}", tier.name, rank, weight))
    return adapters


def make_arrivals(
    adapters: list[LoRAZipfAdapter],
    num_requests: int,
    rate_per_s: float,
    interactive_fraction: float,
    seed: int = 1,
) -> list[LoRAZipfArrival]:
    """Poisson arrivals at ``rate_per_s``; adapters drawn by weight, users uniformly."""
    rng = random.Random(seed)
    picks = rng.choices(range(len(adapters)), [a.weight for a in adapters], k=num_requests)
    t, out = 0.0, []
    for pick in picks:
        t += rng.expovariate(rate_per_s)
        interactive = rng.random() < interactive_fraction
        out.append(LoRAZipfArrival(t, pick, interactive, rng.randrange(10_000)))
    return out


class LoRAZipfParams(WorkloadParams):
    num_adapters: int = Field(default=50, gt=0, description="N: adapters (over all tiers)")
    zipf_s: float = Field(default=1.0, ge=0, description="popularity skew within a tier")
    tiers: list[TierMix] = Field(
        default_factory=lambda: list(ISSUE_TIERS), description="tenant tiers, in order"
    )
    system_prompt_tokens: int = Field(default=256, ge=0, description="per-adapter system prompt")
    prompt_tokens: int = Field(default=128, gt=0, description="user prompt tokens")
    output_tokens: int = Field(default=64, gt=0, description="interactive answer tokens")
    background_output_tokens: int = Field(default=256, gt=0, description="background answers")
    interactive_fraction: float = Field(default=0.7, ge=0, le=1, description="interactive share")

    @field_validator("tiers")
    @classmethod
    def _tiers_valid(cls, tiers: list[TierMix]) -> list[TierMix]:
        names = [t.name for t in tiers]
        if not tiers or len(set(names)) != len(names):
            raise ValueError(f"tiers must be at least one, with distinct names; got {names}")
        if sum(t.traffic_share for t in tiers) <= 0:
            raise ValueError("tiers: the traffic shares must add up to more than 0")
        return tiers


class LoRAZipf(Workload[LoRAZipfParams]):
    name = "lora-zipf"
    params_cls = LoRAZipfParams

    def setup(self) -> None:
        p = self.params
        self.population = make_adapters(p.num_adapters, p.zipf_s, tuple(p.tiers), self.seed)
        self.cum_weights = list(itertools.accumulate(a.weight for a in self.population))
        self.systems = [
            self.builder.text(p.system_prompt_tokens, self.content_rng)
            if p.system_prompt_tokens
            else ""
            for _ in self.population
        ]

    def adapters(self) -> list[str]:
        return [a.adapter_id for a in self.population]

    def next_request(self) -> RequestSpec:
        p = self.params
        k = self.rng.choices(range(len(self.population)), cum_weights=self.cum_weights)[0]
        adapter = self.population[k]
        interactive = self.rng.random() < p.interactive_fraction
        prompt = self.builder.text(p.prompt_tokens, self.rng)
        return self.spec(
            [prompt],
            p.output_tokens if interactive else p.background_output_tokens,
            system=self.systems[k] or None,
            model=adapter.adapter_id,
            adapter=adapter.adapter_id,
            tenant=adapter.tier,
            priority="critical" if interactive else "sheddable",
        )
