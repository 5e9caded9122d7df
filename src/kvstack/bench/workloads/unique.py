"""``unique``: every prompt is new (no reuse), to measure overhead."""

from __future__ import annotations

from pydantic import Field

from kvstack.bench.workloads.base import RequestSpec, Workload, WorkloadParams

__all__ = ["Unique"]


class UniqueParams(WorkloadParams):
    prompt_tokens: int = Field(default=512, gt=0, description="tokens per prompt")
    output_tokens: int = Field(default=64, gt=0, description="tokens per answer")


class Unique(Workload[UniqueParams]):
    name = "unique"
    params_cls = UniqueParams

    def next_request(self) -> RequestSpec:
        p = self.params
        return self.spec([self.builder.text(p.prompt_tokens, self.rng)], p.output_tokens)
