"""Configuration of the ``router`` section.

A minimal file::

    router:
      port: 8080
      backends: [{url: "http://10.0.0.1:8000"}, {url: "http://10.0.0.2:8000"}]
      policy: least_load
      models:
        - name: support
          targets: [{model: support-v1, weight: 90}, {model: support-v2, weight: 10}]
      model_aliases: {gpt-4o-mini: toy-llama}
      auth:
        api_keys_file: /etc/kvstack/api-keys        # "KEY TENANT" lines
      tenants:                                      # KV never crosses tenants unless shared here
        acme: {max_priority: critical}
        docs-a: {kv_namespace: shared-docs}         # docs-a and docs-b share KV
        docs-b: {kv_namespace: shared-docs}

``policy`` names a preset pipeline; ``pipeline`` spells one out (filters, weighted scorers, a
picker, each by registered name with ``args``) and wins over ``policy`` when given.

The subsections live with the code they configure (``fleet``, ``scheduling``, ``admission``,
``pd``), each a leaf: importing this module imports no runtime module of the router, and
every class named below stays importable from here.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from kvstack.router.admission.config import PRIORITIES, Priority
from kvstack.router.fleet.config import (
    BackendConfig,
    DiscoveryConfig,
    EjectionConfig,
    HealthConfig,
    KubernetesConfig,
    ScrapeConfig,
)
from kvstack.router.pd.config import PDConfig
from kvstack.router.scheduling.config import POLICIES, PipelineConfig, PluginSpec, PrefixConfig
from kvstack.section import Section, parse_size

# The router's one default port, for `kvstack router` and `kvstack up` alike: not vLLM's 8000,
# so a router and an engine on one host never ask for the same port.
ROUTER_PORT = 8080

__all__ = [
    "ROUTER_PORT",
    "AdaptersConfig",
    "ApiKeyConfig",
    "AuthConfig",
    "BackendConfig",
    "DiscoveryConfig",
    "EjectionConfig",
    "HealthConfig",
    "KubernetesConfig",
    "LimitsConfig",
    "ModelRoute",
    "ModelTarget",
    "PDConfig",
    "PipelineConfig",
    "PluginSpec",
    "PrefixConfig",
    "RetryConfig",
    "RouterConfig",
    "RouterTenantConfig",
    "ScrapeConfig",
    "TimeoutsConfig",
]


class TimeoutsConfig(Section):
    connect_s: float = Field(default=3.0, gt=0, description="TCP connect to a backend")
    first_byte_s: float = Field(
        default=300.0,
        gt=0,
        description="until the first body byte (streaming: first token; otherwise the answer)",
    )
    total_s: float = Field(default=1800.0, gt=0, description="whole request, streaming included")


class RetryConfig(Section):
    max_attempts: int = Field(
        default=3, ge=1, le=10, description="attempts per request, the first included"
    )
    backoff_base_s: float = Field(default=0.02, ge=0, description="backoff before retry 1")
    backoff_max_s: float = Field(default=0.5, ge=0, description="backoff cap (doubling, jitter)")
    on_status: list[int] = Field(
        default_factory=lambda: [500, 502, 503, 504],
        description="upstream statuses retried on another backend (before any byte is sent)",
    )

    @field_validator("on_status")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        bad = [s for s in value if not 500 <= s <= 599]
        if bad:
            raise ValueError(f"on_status must hold 5xx codes only, got {bad}")
        return value


class LimitsConfig(Section):
    max_request_bytes: int = Field(
        default=16 * 2**20, gt=0, description='largest request body; sizes like "16MiB" accepted'
    )

    stored_response_ids: int = Field(
        default=65536,
        ge=1,
        description="Responses API ids remembered with the backend holding each (GET "
        "/v1/responses/{id}, cancel, previous_response_id reach it); oldest forgotten first",
    )

    @field_validator("max_request_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value, "max_request_bytes") if isinstance(value, str) else value


class ApiKeyConfig(Section):
    key: SecretStr = Field(description="the bearer token clients send")
    tenant: str = Field(default="default", min_length=1, description="tenant of this key")


class AuthConfig(Section):
    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="accepted API keys; none and no file: auth off"
    )
    api_keys_file: str | None = Field(
        default=None,
        description='file of "KEY [TENANT]" lines (# comments); re-read when it changes',
    )
    upstream_api_key: SecretStr | None = Field(
        default=None,
        description="bearer token the router sends to backends (vLLM's VLLM_API_KEY): on "
        "proxied requests, health and model reads, scrapes and adapter loads",
    )
    admin_key: SecretStr | None = Field(
        default=None,
        description="a request sending it in x-kvstack-admin-key gets the full "
        "x-kvstack-decision header (match counts, scores); lora.admin_key works too",
    )


class RouterTenantConfig(Section):
    """What one tenant (the name its API keys carry) may do and share."""

    kv_namespace: str | None = Field(
        default=None,
        min_length=1,
        description="tenants naming the same namespace share KV (engine prefix cache, kvstack "
        "tiers, routing credit); none: the tenant's KV is its own",
    )
    max_priority: Priority = Field(
        default="standard",
        description="highest x-kvstack-priority the tenant may ask for; a higher one is lowered",
    )


class ModelTarget(Section):
    model: str = Field(min_length=1, description="a base model or LoRA adapter the backends serve")
    weight: float = Field(default=1.0, gt=0, description="relative share of traffic")


class ModelRoute(Section):
    name: str = Field(min_length=1, description="model name clients ask for")
    targets: list[ModelTarget] = Field(min_length=1, description="weighted targets")
    sticky: bool = Field(
        default=True, description="the same session or user always gets the same target"
    )


class AdaptersConfig(Section):
    """LoRA adapters through the control plane (:mod:`kvstack.lora`, the ``lora`` section)."""

    enabled: bool = Field(
        default=False,
        description="resolve model names through the adapter registry and load adapters with "
        "the cache manager (configured by the `lora` section of the same file)",
    )
    request_class_header: str = Field(
        default="x-kvstack-request-class",
        description="header naming the request's class (its cold-start budget in lora)",
    )
    default_request_class: str = Field(
        default="interactive", description="class of requests without the header"
    )
    priority_by_tier: dict[str, str] = Field(
        default_factory=lambda: {"platinum": "critical"},
        description="adapter priority tier -> router priority, for requests that name none",
    )
    admin_path: str = Field(
        default="/admin/lora", description="where the adapter admin API is served (admin key)"
    )
    tenant_isolation: bool = Field(
        default=True,
        description="an API key sees only its tenant's adapters (a key without a tenant is "
        "tenant 'default'); false: every key may use every adapter",
    )

    @field_validator("request_class_header")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()

    @field_validator("priority_by_tier")
    @classmethod
    def _priorities(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(p for p in value.values() if p not in PRIORITIES)
        if bad:
            raise ValueError(f"priorities {bad} are not among {', '.join(PRIORITIES)}")
        return value

    @field_validator("admin_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") in ("", "/v1"):
            raise ValueError(
                f"admin_path must be a path of its own like /admin/lora, got {value!r}"
            )
        return value.rstrip("/")


class RouterConfig(Section):
    host: str = Field(default="0.0.0.0", description="listen address")
    port: int = Field(default=ROUTER_PORT, ge=1, le=65535, description="listen port")
    backends: list[BackendConfig] = Field(
        default_factory=list, description="static backends (discovery.kind = static)"
    )
    discovery: DiscoveryConfig = Field(
        default_factory=DiscoveryConfig, description="where backends come from"
    )
    policy: str = Field(
        default="ttft",
        description=f"preset pipeline: {', '.join(POLICIES)} (ttft: the predicted-TTFT cost "
        "model; prefix: llm-d-style prefix + load scores)",
    )
    pipeline: PipelineConfig | None = Field(
        default=None, description="explicit pipeline; overrides policy"
    )
    admission: PluginSpec = Field(
        default_factory=lambda: PluginSpec(name="immediate"),
        description="admission plugin run before a backend is chosen (priorities, shedding)",
    )
    prefix: PrefixConfig = Field(
        default_factory=PrefixConfig, description="prompt tokens, prefix index, KV events, tiers"
    )
    pd: PDConfig = Field(default_factory=PDConfig, description="prefill/decode disaggregation")
    models: list[ModelRoute] = Field(default_factory=list, description="weighted model routes")
    model_aliases: dict[str, str] = Field(
        default_factory=dict, description="alias -> model or route name"
    )
    session_header: str = Field(
        default="x-session-id", description="header naming the session (else the `user` field)"
    )
    health: HealthConfig = Field(default_factory=HealthConfig, description="active checks")
    ejection: EjectionConfig = Field(
        default_factory=EjectionConfig, description="passive ejection on failed traffic"
    )
    scrape: ScrapeConfig = Field(
        default_factory=ScrapeConfig, description="reading the engines' /metrics"
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig, description="timeouts")
    retry: RetryConfig = Field(default_factory=RetryConfig, description="retries")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="request limits")
    auth: AuthConfig = Field(default_factory=AuthConfig, description="API keys")
    tenants: dict[str, RouterTenantConfig] = Field(
        default_factory=dict,
        description="per tenant (the name an API key carries): KV namespace, highest priority",
    )
    default_max_priority: Priority = Field(
        default="standard",
        description="highest x-kvstack-priority of callers without an API key and of tenants "
        "not listed in `tenants` (critical skips admission: grant it per tenant)",
    )
    debug_headers: bool = Field(
        default=False,
        description="every caller gets the full x-kvstack-decision header; off: only callers "
        "with the admin key (others see the backend and the reason)",
    )
    client_kv_transfer_params: bool = Field(
        default=False,
        description="forward every caller's `kv_transfer_params` to the engines; off: only "
        "callers with the admin key may send them, others' are dropped (they steer the "
        "engine's KV connector: kvstack's load mode, a P/D connector's remote host)",
    )
    adapters: AdaptersConfig = Field(
        default_factory=AdaptersConfig, description="LoRA adapters via the control plane"
    )
    seed: int | None = Field(default=None, description="seed of random choices (tests)")

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"policy {value!r} is unknown; choose one of {', '.join(POLICIES)}")
        return value

    @field_validator("session_header")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()

    @model_validator(mode="after")
    def _names(self) -> RouterConfig:
        names = [route.name for route in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model routes defined twice: {duplicates}")
        clashes = sorted(set(names) & set(self.model_aliases))
        if clashes:
            raise ValueError(f"names used both as route and alias: {clashes}")
        ids = [b.name or b.url for b in self.backends]
        if len(set(ids)) != len(ids):
            raise ValueError(f"backend names/URLs must be unique, got {ids}")
        return self
