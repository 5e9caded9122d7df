"""``lora-zipf``: requests over N adapters with Zipf popularity, tenant tiers and two classes.

Adapter ``k`` (named ``<adapter_prefix><k>``, rank 0 the most popular) is requested with
probability proportional to ``1 / (k + 1) ** zipf_s``. Adapters belong to tenant tiers by
rank (the first ``premium_fraction`` of them "premium", the next ``standard_fraction``
"standard", the rest "free"). A request is interactive (priority ``critical``) with
probability ``interactive_fraction``, else background (``sheddable``, longer answers).
Each adapter has its own system prompt, so KV reuse stays within an adapter.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from kvstack.bench.workloads.base import RequestSpec, Workload, WorkloadParams
from kvstack.bench.workloads.zipf import ZipfSampler

__all__ = ["LoRAZipf", "adapter_names"]


class LoRAZipfParams(WorkloadParams):
    num_adapters: int = Field(default=20, gt=0, description="N: adapters")
    adapter_prefix: str = Field(default="adapter-", min_length=1, description="adapter names")
    zipf_s: float = Field(default=1.1, ge=0, description="popularity skew")
    system_prompt_tokens: int = Field(default=256, ge=0, description="per-adapter system prompt")
    prompt_tokens: int = Field(default=128, gt=0, description="user prompt tokens")
    output_tokens: int = Field(default=64, gt=0, description="interactive answer tokens")
    background_output_tokens: int = Field(default=256, gt=0, description="background answers")
    interactive_fraction: float = Field(default=0.7, ge=0, le=1, description="interactive share")
    premium_fraction: float = Field(default=0.1, ge=0, le=1, description="premium adapters")
    standard_fraction: float = Field(default=0.3, ge=0, le=1, description="standard adapters")

    @model_validator(mode="after")
    def _fractions(self) -> LoRAZipfParams:
        if self.premium_fraction + self.standard_fraction > 1:
            raise ValueError(
                f"premium_fraction + standard_fraction must be <= 1, got "
                f"{self.premium_fraction} + {self.standard_fraction}"
            )
        return self


def adapter_names(params: LoRAZipfParams) -> list[str]:
    return [f"{params.adapter_prefix}{k}" for k in range(params.num_adapters)]


class LoRAZipf(Workload[LoRAZipfParams]):
    name = "lora-zipf"
    params_cls = LoRAZipfParams

    def setup(self) -> None:
        p = self.params
        self.adapters_by_rank = adapter_names(p)
        self.pick = ZipfSampler(p.num_adapters, p.zipf_s)
        self.systems = [
            self.builder.text(p.system_prompt_tokens, self.content_rng)
            if p.system_prompt_tokens
            else ""
            for _ in self.adapters_by_rank
        ]
        # At least one premium adapter whenever the fraction is positive.
        premium = math.ceil(p.num_adapters * p.premium_fraction)
        standard = min(round(p.num_adapters * p.standard_fraction), p.num_adapters - premium)
        self.tiers = ["premium"] * premium + ["standard"] * standard
        self.tiers += ["free"] * (p.num_adapters - len(self.tiers))

    def adapters(self) -> list[str]:
        return list(self.adapters_by_rank)

    def next_request(self) -> RequestSpec:
        p = self.params
        k = self.pick(self.rng)
        interactive = self.rng.random() < p.interactive_fraction
        prompt = self.builder.text(p.prompt_tokens, self.rng)
        return self.spec(
            [prompt],
            p.output_tokens if interactive else p.background_output_tokens,
            system=self.systems[k] or None,
            model=self.adapters_by_rank[k],
            adapter=self.adapters_by_rank[k],
            tenant=self.tiers[k],
            priority="critical" if interactive else "sheddable",
        )
