"""The ``epp`` config section: the endpoint picker's listener, TLS, body modes and the Kubernetes
resources it follows. What it decides with is the ``router`` section of the same file (pipeline,
admission, prefix state, LoRA, model routes): one brain. A leaf: no runtime imports.

    epp:
      host: 0.0.0.0
      port: 9002                 # ext_proc gRPC (GIE's default)
      health_port: 9003          # gRPC health, plaintext (kubelet probes cannot speak TLS)
      tls: {self_signed: true}   # GIE's default: serve TLS, the gateway does not verify
      pool:
        name: vllm-llama3-8b     # InferencePool to follow; none: the router's backends
        namespace: llm
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvstack.section import Section

__all__ = [
    "INFERENCE_MODEL_VERSIONS",
    "OBJECTIVE_VERSIONS",
    "POOL_VERSIONS",
    "BodyMode",
    "EppConfig",
    "EppTLSConfig",
    "PoolConfig",
]

# The API versions kvstack reads, as (group/version) strings; anything else is refused.
POOL_VERSIONS = ("inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2")
OBJECTIVE_VERSIONS = ("inference.networking.x-k8s.io/v1alpha2",)
INFERENCE_MODEL_VERSIONS = ("inference.networking.x-k8s.io/v1alpha2",)

BodyMode = Literal["full_duplex_streamed", "buffered"]


def _known(value: str, known: tuple[str, ...], kind: str) -> str:
    if value not in known:
        raise ValueError(f"unknown {kind} API version {value!r}; kvstack reads {', '.join(known)}")
    return value


class EppTLSConfig(Section):
    cert_file: str | None = Field(default=None, description="PEM certificate served")
    key_file: str | None = Field(default=None, description="PEM private key of cert_file")
    self_signed: bool = Field(
        default=False,
        description="serve TLS with a certificate made at start (GIE's default; the gateway "
        "does not verify it); ignored when cert_file is set",
    )
    client_ca_file: str | None = Field(
        default=None,
        description="PEM CA bundle: require client certificates signed by it (mutual TLS; "
        "this authenticates the gateway)",
    )

    @model_validator(mode="after")
    def _pair(self) -> EppTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together")
        if self.client_ca_file and not (self.cert_file or self.self_signed):
            raise ValueError("tls.client_ca_file needs a server certificate (cert_file or "
                             "self_signed)")  # fmt: skip
        return self

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None or self.self_signed


class PoolConfig(Section):
    """The InferencePool (endpoints), InferenceObjectives and InferenceModels followed."""

    name: str | None = Field(
        default=None, description="InferencePool name; none: the router's backends/discovery"
    )
    namespace: str = Field(default="default", description="namespace of the pool and its pods")
    api_version: str = Field(
        default=POOL_VERSIONS[0],
        description=f"InferencePool group/version: {', '.join(POOL_VERSIONS)}",
    )
    objectives: bool = Field(
        default=True, description="follow InferenceObjectives of the pool (priorities)"
    )
    objective_api_version: str = Field(
        default=OBJECTIVE_VERSIONS[0], description="InferenceObjective group/version"
    )
    inference_models: bool = Field(
        default=False,
        description="also follow the older InferenceModels (criticality, weighted targetModels)",
    )
    inference_model_api_version: str = Field(
        default=INFERENCE_MODEL_VERSIONS[0], description="InferenceModel group/version"
    )
    scheme: Literal["http", "https"] = Field(default="http", description="engine URL scheme")
    role_label: str = Field(
        default="kvstack.io/role", description="pod label holding the prefill/decode role"
    )
    relist_interval_s: float = Field(default=60.0, gt=0, description="full re-list period")
    watch_timeout_s: int = Field(
        default=30, ge=1, le=3600, description="server-side timeout of one watch request"
    )
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file; None: in-cluster service account"
    )
    api_url: str | None = Field(
        default=None, description="API server URL without credentials (a local proxy, tests)"
    )

    @field_validator("api_version")
    @classmethod
    def _pool_version(cls, value: str) -> str:
        return _known(value, POOL_VERSIONS, "InferencePool")

    @field_validator("objective_api_version")
    @classmethod
    def _objective_version(cls, value: str) -> str:
        return _known(value, OBJECTIVE_VERSIONS, "InferenceObjective")

    @field_validator("inference_model_api_version")
    @classmethod
    def _model_version(cls, value: str) -> str:
        return _known(value, INFERENCE_MODEL_VERSIONS, "InferenceModel")


class EppConfig(Section):
    host: str = Field(
        default="127.0.0.1",
        description="listen address; beyond loopback it needs authentication (a cluster "
        "secret token or mutual TLS) or security.insecure_no_auth",
    )
    port: int = Field(default=9002, ge=0, le=65535, description="ext_proc gRPC port (0: any free)")
    health_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="plaintext gRPC health port for kubelet probes (services liveness, "
        "readiness, envoy.service.ext_proc.v3.ExternalProcessor); 0: only on `port`",
    )
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Prometheus /metrics over HTTP; 0: off"
    )
    tls: EppTLSConfig = Field(default_factory=EppTLSConfig, description="TLS of `port`")
    request_body_mode: BodyMode = Field(
        default="full_duplex_streamed",
        description="ext_proc request body mode assumed when Envoy does not say "
        "(protocol_config); GIE gateways use full_duplex_streamed",
    )
    response_body_mode: BodyMode | Literal["none", "streamed"] = Field(
        default="full_duplex_streamed",
        description="ext_proc response body mode assumed when Envoy does not say",
    )
    objective_header: str = Field(
        default="x-gateway-inference-objective",
        description="request header naming the InferenceObjective (GIE's)",
    )
    max_streams: int = Field(
        default=10000, ge=1, description="concurrent ext_proc streams (HTTP requests)"
    )
    max_pending_decisions: int = Field(
        default=64,
        ge=1,
        description="requests that may wait for their pick at once; the next stream is "
        "refused with gRPC RESOURCE_EXHAUSTED at once (the gateway's failure mode decides: "
        "fail-open routes without the EPP), so overload never queues picks for seconds; "
        "gRPC core's queue of calls not yet taken is bounded at the same size",
    )
    idle_timeout_s: float = Field(
        default=300.0,
        ge=0,
        description="a stream on which the gateway sends nothing for this long is closed "
        "(DEADLINE_EXCEEDED) and its request finished as cancelled; keep it above the "
        "slowest first response byte (a non-streamed completion's headers come at its end); "
        "0: never",
    )
    pool: PoolConfig = Field(default_factory=PoolConfig, description="Kubernetes resources")
    grace_s: float = Field(default=5.0, ge=0, description="shutdown grace for open streams")

    @field_validator("objective_header")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()
