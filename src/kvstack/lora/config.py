"""Configuration of the ``lora`` section: registry, artifact store, trust, cache policy, budgets.

The cache policy has the shape operators write in YAML::

    lora:
      adapter_cache_policy:
        gpu_slots_per_base_model: 8
        host_slots_per_base_model: 64
        eviction_policy: weighted-lru        # or lru, the baseline
        hot_score: {qps_30m: 0.45, ttft_penalty_if_cold: 0.25, tenant_priority: 0.20,
                    scheduled_warmup: 0.10}
        never_evict_when: ["status == 'canary' and canary_percent > 0",
                           "tenant_priority == 'platinum' and home_rank < 1"]
        demote_when: ["no_request_for_minutes > 60", "error_rate_after_load > 0.02"]

Rules are checked when the config loads (unknown fields, type mismatches and anything beyond
names, constants, comparisons and and/or/not are errors), see :mod:`kvstack.lora.expr`; their
fields are those of :class:`kvstack.lora.facts.AdapterFacts`. ``home_rank`` is an engine's place
in the adapter's rendezvous order: pinning platinum on its home engine (``home_rank < 1``)
rather than on every engine costs one warm slot per adapter instead of one per engine, which in
the benchmark is the difference between weighted hotness clearly beating LRU and barely.

A leaf of the package: besides :mod:`kvstack.section` it imports only the rule language and the
fact schema, both pure and config-level, so loading the section loads no runtime module.

Renamed keys and fact names (:data:`kvstack.lora.facts.RENAMED_FACTS`: ``qps_10m`` is now
``qps_30m``, the window it always had) are still accepted, as hot-score keys and in rules, with
a ``FutureWarning`` naming the new one; the loaded config holds the new names.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from kvstack.lora.expr import compile_rule, rename_fields
from kvstack.lora.facts import FACT_TYPES, RENAMED_FACTS
from kvstack.section import Section, parse_size

__all__ = [
    "AdapterCachePolicy",
    "AdapterEngineSpec",
    "BaseModelRef",
    "HotScoreWeights",
    "LoRAConfig",
    "RequestClassBudget",
    "ScheduledWarmup",
    "TenantPolicy",
]

SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class HotScoreWeights(Section):
    """Weights of the hot score's features; each feature lies in [0, 1]."""

    qps_30m: float = Field(
        default=0.45,
        ge=0,
        description="request rate of the adapter on the engine, decayed over qps_window_s "
        "(default 30 minutes), all versions together, times this version's share of traffic "
        "(0 once superseded); formerly qps_10m, still accepted with a warning",
    )
    ttft_penalty_if_cold: float = Field(
        default=0.25, ge=0, description="predicted reload time if evicted, relative to others"
    )
    tenant_priority: float = Field(default=0.20, ge=0, description="weight of the tier's priority")
    scheduled_warmup: float = Field(
        default=0.10, ge=0, description="bonus while a scheduled warmup window covers the adapter"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in RENAMED_FACTS.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"hot_score: give {new} only ({old} is its former name)")
            _warn_renamed(f"lora.adapter_cache_policy.hot_score.{old}", old, new)
            data[new] = data.pop(old)
        return data


class AdapterCachePolicy(Section):
    gpu_slots_per_base_model: int = Field(
        default=8, ge=1, le=4096, description="hot slots per engine (the engine's max_loras)"
    )
    host_slots_per_base_model: int = Field(
        default=64,
        ge=1,
        le=1_000_000,
        description="warm slots per engine host (verified files; >= the engine's max_cpu_loras)",
    )
    eviction_policy: Literal["weighted-lru", "lru"] = Field(
        default="weighted-lru", description="weighted-lru (hot score) or lru (the baseline)"
    )
    hot_score: HotScoreWeights = Field(default_factory=HotScoreWeights)
    never_evict_when: list[str] = Field(
        default_factory=lambda: [
            "status == 'canary' and canary_percent > 0",
            "tenant_priority == 'platinum' and home_rank < 1",
        ],
        description="rules; a matching adapter never leaves the host tier and leaves the GPU "
        "tier last",
    )
    demote_when: list[str] = Field(
        default_factory=lambda: ["no_request_for_minutes > 60", "error_rate_after_load > 0.02"],
        description="rules; a matching adapter moves one tier down per sweep",
    )
    qps_window_s: float = Field(
        default=1800.0,
        gt=0,
        description="time constant of the decayed request rate (the qps_30m feature, named "
        "after this default); with 10 minutes rarely used adapters have decayed counts of 0-3, "
        "which rank them by chance",
    )
    demote_interval_s: float = Field(default=60.0, gt=0, description="seconds between sweeps")

    @field_validator("never_evict_when", "demote_when")
    @classmethod
    def _rules_parse(cls, rules: list[str]) -> list[str]:
        rules = [_upgraded_rule(rule) for rule in rules]
        for rule in rules:
            compile_rule(rule, FACT_TYPES)
        return rules


class RequestClassBudget(Section):
    cold_start_budget_s: float | None = Field(
        default=None,
        ge=0,
        description="longest predicted load a request waits for; None: wait (queued)",
    )
    on_over_budget: Literal["fallback", "reject"] = Field(
        default="fallback",
        description="fallback: base model when the tenant allows it, else 503 + Retry-After",
    )
    max_concurrent_cold_loads: int | None = Field(
        default=None, ge=1, description="cold loads of this class at once per engine; None: any"
    )


def _default_classes() -> dict[str, RequestClassBudget]:
    return {
        "interactive": RequestClassBudget(cold_start_budget_s=2.0),
        "background": RequestClassBudget(max_concurrent_cold_loads=2, on_over_budget="reject"),
    }


class TenantPolicy(Section):
    allow_base_fallback: bool = Field(
        default=False, description="serve the base model (marked in a header) when cold"
    )


class BaseModelRef(Section):
    path: str = Field(description="directory holding the base model's config.json")
    revision: str = Field(default="", description="base model revision adapters must match")
    tokenizer_revision: str = Field(default="", description="tokenizer revision; '' = any")


class AdapterEngineSpec(Section):
    url: str = Field(description="engine base URL, e.g. http://10.0.0.5:8000")
    base_model: str = Field(description="registry name of the base model it serves")
    served_model_name: str = Field(description="the base model's name on the engine")
    warm_dir: str = Field(description="directory on the engine host for verified adapters")
    engine_warm_dir: str | None = Field(
        default=None, description="the same directory as the engine sees it; None: warm_dir"
    )
    gpu_slots: int | None = Field(default=None, ge=1, description="None: the policy default")
    host_slots: int | None = Field(default=None, ge=1, description="None: the policy default")
    max_lora_rank: int = Field(default=16, ge=1, description="the engine's --max-lora-rank")

    @field_validator("url")
    @classmethod
    def _no_trailing_slash(cls, url: str) -> str:
        return url.rstrip("/")  # the router matches backends to engines by URL


class ScheduledWarmup(Section):
    select: str = Field(description="rule selecting adapters, e.g. \"tenant_id == 'acme'\"")
    at: str = Field(default="startup", description="'startup' or a daily UTC time 'HH:MM'")
    lead_minutes: float = Field(default=10.0, ge=0, description="warm this long before 'at'")
    hold_minutes: float = Field(default=60.0, ge=0, description="score bonus lasts this long")

    @field_validator("select")
    @classmethod
    def _select_parses(cls, rule: str) -> str:
        rule = _upgraded_rule(rule)
        compile_rule(rule, FACT_TYPES)
        return rule

    @field_validator("at")
    @classmethod
    def _at_valid(cls, at: str) -> str:
        if at == "startup":
            return at
        hours, _, minutes = at.partition(":")
        if not (hours.isdigit() and minutes.isdigit() and int(hours) < 24 and int(minutes) < 60):
            raise ValueError(f"warmup time {at!r} must be 'startup' or HH:MM (00:00-23:59)")
        return at


class LoRAConfig(Section):
    registry_url: str = Field(
        default="sqlite:///kvstack-lora.db",
        description="SQLAlchemy URL: sqlite:///path.db or postgresql+psycopg://user@host/db",
    )
    artifact_store: str = Field(
        default="file://./kvstack-adapters",
        description="content-addressed store: file:///dir or s3://bucket/prefix",
    )
    s3_endpoint_url: str | None = Field(default=None, description="S3 endpoint (MinIO, moto)")
    source_allowlist: list[str] = Field(
        default_factory=list,
        description="URI prefixes adapters may be registered from (file:///srv/a/, s3://b/p/)",
    )
    trusted_keys: list[str] = Field(
        default_factory=list, description="PEM files of Ed25519 public keys trusted to sign"
    )
    require_signature: bool = Field(default=True, description="refuse unsigned adapters")
    max_adapter_size: str = Field(default="2GiB", description="hard cap on adapter weight files")
    supported_modules: list[str] = Field(
        default_factory=lambda: list(SUPPORTED_MODULES),
        description="target modules engines can serve",
    )
    base_models: dict[str, BaseModelRef] = Field(default_factory=dict)
    priority_weights: dict[str, float] = Field(
        default_factory=lambda: {"platinum": 1.0, "gold": 0.7, "standard": 0.1},
        description="priority tiers and their weight in the hot score (0-1)",
    )
    tenants: dict[str, TenantPolicy] = Field(default_factory=dict)
    default_tenant: TenantPolicy = Field(default_factory=TenantPolicy)
    adapter_cache_policy: AdapterCachePolicy = Field(default_factory=AdapterCachePolicy)
    request_classes: dict[str, RequestClassBudget] = Field(default_factory=_default_classes)
    load_time_prior_s: dict[str, float] = Field(
        default_factory=lambda: {"warm": 0.5, "cold": 3.0},
        description="predicted load time before enough loads were observed",
    )
    engines: list[AdapterEngineSpec] = Field(default_factory=list)
    engine_timeout_s: float = Field(default=30.0, gt=0, description="per engine call")
    io_threads: int = Field(
        default=16, ge=1, le=1024, description="threads for store fetches and verification"
    )
    slot_wait_s: float = Field(
        default=30.0, ge=0, description="a load waits this long for a slot while all are in use"
    )
    reconcile_interval_s: float = Field(default=10.0, gt=0)
    canary_prewarm_engines: int = Field(
        default=1, ge=0, description="engines that prewarm a canary before it takes traffic"
    )
    scheduled_warmups: list[ScheduledWarmup] = Field(default_factory=list)
    metrics_top_k: int = Field(default=20, ge=1, le=10_000, description="adapters named in metrics")
    admin_key: SecretStr | None = Field(default=None, description="bearer key of the admin API")

    @field_validator("max_adapter_size")
    @classmethod
    def _size_parses(cls, text: str) -> str:
        parse_size(text, "lora.max_adapter_size")
        return text

    @field_validator("priority_weights")
    @classmethod
    def _weights_in_range(cls, weights: dict[str, float]) -> dict[str, float]:
        for tier, weight in weights.items():
            if not 0.0 <= weight <= 1.0:
                raise ValueError(f"priority weight of {tier!r} is {weight}; allowed 0.0-1.0")
        return weights

    @model_validator(mode="after")
    def _classes_named(self) -> LoRAConfig:
        for name, role in (("interactive", "the default class"), ("background", "prewarms")):
            if name not in self.request_classes:
                raise ValueError(f"request_classes must define {name!r} ({role})")
        for tier in ("warm", "cold"):
            if self.load_time_prior_s.get(tier, -1.0) < 0:
                raise ValueError(f"load_time_prior_s.{tier} must be given and >= 0")
        return self

    @property
    def max_adapter_bytes(self) -> int:
        return parse_size(self.max_adapter_size, "lora.max_adapter_size")

    def tenant(self, tenant_id: str) -> TenantPolicy:
        return self.tenants.get(tenant_id, self.default_tenant)


def _warn_renamed(where: str, old: str, new: str) -> None:
    warnings.warn(
        f"{where}: {old!r} is deprecated and will be removed; use {new!r} "
        f"(the same value under the name that says its window)",
        FutureWarning,
        stacklevel=4,
    )


def _upgraded_rule(rule: str) -> str:
    """``rule`` with former fact names replaced by their new ones (with a warning)."""
    upgraded, old_names = rename_fields(rule, RENAMED_FACTS)
    for old in old_names:
        _warn_renamed(f"rule {rule!r}", old, RENAMED_FACTS[old])
    return upgraded
