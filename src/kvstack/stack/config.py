"""Configuration of ``kvstack up`` (the ``stack`` section): which components run, and how.

A two-engine stack with a shared disk tier behind the router::

    stack:
      run_dir: .kvstack/run
      engines:
        - name: engine
          kind: vllm            # or sim (the default: the simulator; no vLLM needed)
          replicas: 2
          model: toy            # toy | toy-small | a local model directory
          connector:
            tiers: ["cpu://?size=1GiB", "file://{run_dir}/kv?size=4GiB"]
      router: {port: 8080}      # the router's default port, as for `kvstack router`
      index: {port: 8300}       # optional: the cluster KV index service
      redis: {port: 6390}       # optional: a local redis-server (must be on PATH)

Tier URLs may use ``{run_dir}`` and ``{redis_url}``. Ports left out are picked free.

Cores: on vLLM's CPU build every vLLM engine gets its own cores (``VLLM_CPU_OMP_THREADS_BIND``)
and one core is kept for the router, the index, redis and the connector's threads when there
are more cores than engines; :mod:`kvstack.stack.cores` has the rule, ``cores:`` the knobs::

      cores: {bind: auto, reserved: 1}   # bind: auto (CPU build only) | on | off

Multi-tenant LoRA: engines with ``lora:`` slots, and a top-level ``lora:`` holding the adapter
control plane's settings (the ``kvstack.lora`` section: registry, store, trusted keys, tenants,
budgets). The router then resolves adapter names through the registry and loads adapters into
those engines; its config file (``{run_dir}/router.yaml``) also serves ``kvstack adapters``
(``KVSTACK_CONFIG={run_dir}/router.yaml kvstack adapters list``). See
``examples/multi-tenant-lora.yaml``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from kvstack.router.config import ROUTER_PORT
from kvstack.section import Section

__all__ = [
    "ConnectorSpec",
    "CoresSpec",
    "EngineLoRASpec",
    "IndexSpec",
    "RedisSpec",
    "RouterSpec",
    "StackConfig",
    "StackEngineSpec",
]


class ConnectorSpec(Section):
    tiers: list[str] = Field(
        default_factory=lambda: ["cpu://?size=1GiB"], description="kvstack tier URLs, fastest first"
    )
    chunk_size: int = Field(default=256, gt=0, description="tokens per kvstack chunk")
    role: Literal["kv_both", "kv_producer", "kv_consumer"] = Field(
        default="kv_both", description="connector role (producer: prefill engines)"
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="more kv_connector_extra_config keys"
    )


class EngineLoRASpec(Section):
    max_loras: int = Field(default=4, ge=1, description="adapter slots on the GPU (--max-loras)")
    max_cpu_loras: int = Field(
        default=8, ge=1, description="adapters kept in host memory (--max-cpu-loras)"
    )
    max_lora_rank: int = Field(default=16, ge=1, description="--max-lora-rank")
    base_model: str | None = Field(
        default=None, description="registry name of the base model; None: the served model name"
    )


class StackEngineSpec(Section):
    name: str = Field(default="engine", pattern=r"^[a-z0-9][a-z0-9-]*$", description="name prefix")
    kind: Literal["vllm", "sim"] = Field(
        default="sim", description="the simulator (the default: no vLLM needed) or real vLLM"
    )
    replicas: int = Field(default=1, ge=1, le=64, description="engines of this spec")
    port: int | None = Field(default=None, ge=1, le=65535, description="first port; None: free")
    model: str = Field(
        default="toy", description="toy, toy-small (built locally) or a model directory / id"
    )
    served_model_name: str | None = Field(default=None, description="name clients use")
    connector: ConnectorSpec | None = Field(default=None, description="kvstack connector, or none")
    kv_events: bool = Field(default=False, description="publish vLLM KV events over ZMQ")
    role: Literal["both", "prefill", "decode"] = Field(
        default="both", description="the router's prefill/decode role of these engines"
    )
    max_model_len: int = Field(default=8192, gt=0, description="context limit")
    kv_cache_space_gib: int = Field(default=1, ge=1, description="vLLM CPU KV cache (GiB)")
    lora: EngineLoRASpec | None = Field(
        default=None, description="LoRA adapter slots, driven by the stack's lora control plane"
    )
    routed: bool = Field(
        default=True, description="behind the router (false: reached only at its own URL)"
    )
    args: list[str] = Field(default_factory=list, description="extra engine command-line args")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment")
    start_timeout_s: float = Field(default=600.0, gt=0, description="time to become healthy")


class RouterSpec(Section):
    port: int | None = Field(default=ROUTER_PORT, ge=1, le=65535, description="listen port")
    policy: str | None = Field(default=None, description="routing policy (router default if None)")
    config: dict[str, Any] = Field(
        default_factory=dict, description="more `router` section keys (backends are filled in)"
    )
    start_timeout_s: float = Field(default=60.0, gt=0)


class IndexSpec(Section):
    port: int | None = Field(default=None, ge=1, le=65535, description="listen port (HTTP)")
    zmq_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="ZMQ port the router looks prefixes up on (engines announce over HTTP)",
    )
    start_timeout_s: float = Field(default=60.0, gt=0)


class RedisSpec(Section):
    port: int | None = Field(default=None, ge=1, le=65535, description="listen port")
    binary: str = Field(default="redis-server", description="redis (or valkey) server binary")
    start_timeout_s: float = Field(default=30.0, gt=0)


class CoresSpec(Section):
    bind: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="give each vLLM engine its own cores (VLLM_CPU_OMP_THREADS_BIND); auto: "
        "when vLLM's CPU build is installed",
    )
    reserved: int | None = Field(
        default=None,
        ge=0,
        description="cores kept for the router, index, redis and connector threads; None: 1 "
        "when there are more cores than engines, else 0",
    )
    cpus: list[int] | None = Field(
        default=None, description="CPUs the stack may use; None: the affinity of `kvstack up`"
    )


class StackConfig(Section):
    run_dir: str = Field(default=".kvstack/run", description="logs, state file and local tiers")
    host: str = Field(default="127.0.0.1", description="address every component listens on")
    engines: list[StackEngineSpec] = Field(
        default_factory=lambda: [StackEngineSpec(kind="sim", replicas=2)],
        description="engine groups",
    )
    router: RouterSpec | None = Field(default_factory=RouterSpec, description="None: no router")
    index: IndexSpec | None = Field(default=None, description="cluster KV index service")
    redis: RedisSpec | None = Field(default=None, description="a local redis-server")
    cores: CoresSpec = Field(default_factory=CoresSpec, description="cores of vLLM CPU engines")
    lora: dict[str, Any] | None = Field(
        default=None,
        description="the router's adapter control plane (the kvstack `lora` section; strings "
        "may use {run_dir}); None: no adapter management",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> StackConfig:
        names = [e.name for e in self.engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        if not self.engines:
            raise ValueError("a stack needs at least one engine")
        if self.lora is not None:
            if self.router is None:
                raise ValueError("lora needs the router (it runs the adapter control plane)")
            if not any(e.lora for e in self.engines):
                raise ValueError("lora is set but no engine has lora slots (engines[].lora)")
        return self
