"""Benchmark workloads by name: ``make_workload("shared-prefix", params, builder, seed)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstack.bench.workloads.base import RequestSpec, Workload, WorkloadParams
from kvstack.bench.workloads.prompts import PromptBuilder
from kvstack.errors import ConfigError
from kvstack.registry import Registry

__all__ = [
    "WORKLOADS",
    "RequestSpec",
    "Workload",
    "WorkloadParams",
    "make_workload",
    "parse_params",
]

WORKLOADS: Registry[type[Workload[Any]]] = Registry("workload")
WORKLOADS.register("multi-round-qa", "kvstack.bench.workloads.multi_round_qa:MultiRoundQA")
WORKLOADS.register("shared-prefix", "kvstack.bench.workloads.shared_prefix:SharedPrefix")
WORKLOADS.register("long-doc-qa", "kvstack.bench.workloads.long_doc_qa:LongDocQA")
WORKLOADS.register("lora-zipf", "kvstack.bench.workloads.lora_zipf:LoRAZipf")
WORKLOADS.register("unique", "kvstack.bench.workloads.unique:Unique")


def parse_params(name: str, params: Mapping[str, Any] | None) -> WorkloadParams:
    """Validate a workload's parameters; errors name the workload and the field."""
    from pydantic import ValidationError

    cls = WORKLOADS.get(name).params_cls
    try:
        return cls.model_validate(dict(params or {}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'params'}: {e['msg']}"
            + (f" (got {e['input']!r})" if e["type"] != "missing" else "")
            for e in exc.errors()
        )
        raise ConfigError(f"workload {name!r}: {problems}") from None


def make_workload(
    name: str, params: Mapping[str, Any] | None, builder: PromptBuilder, seed: int
) -> Workload[Any]:
    return WORKLOADS.get(name)(parse_params(name, params), builder, seed)
