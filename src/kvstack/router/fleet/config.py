"""Configuration of the fleet: ``backends``, ``discovery``, ``health``, ``ejection``, ``scrape``.

Sections of the ``router`` section (:mod:`kvstack.router.config`); a leaf, like every config
module of the router: it imports no runtime module.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from kvstack.section import Section

__all__ = [
    "BackendConfig",
    "DiscoveryConfig",
    "EjectionConfig",
    "HealthConfig",
    "KubernetesConfig",
    "ScrapeConfig",
    "check_backend_url",
]


def check_backend_url(url: str) -> str:
    """``http(s)://host:port`` without a path; the returned form has no trailing slash."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"backend URL {url!r} must look like http://host:port")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"backend URL {url!r} must not carry a path or a query")
    return url.rstrip("/")


class BackendConfig(Section):
    url: str = Field(description="base URL of an OpenAI-compatible engine, http://host:port")
    name: str | None = Field(default=None, description="backend id in metrics; default: the URL")
    models: list[str] | None = Field(
        default=None,
        description="models (base and adapters) it serves; None: read from its /v1/models",
    )
    role: Literal["both", "prefill", "decode"] = Field(
        default="both", description="prefill/decode role for disaggregated serving"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="free-form labels")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_backend_url(value)


class KubernetesConfig(Section):
    namespace: str = Field(default="default", description="namespace of the engine pods")
    label_selector: str = Field(
        default="app=vllm", min_length=1, description="label selector of the engine pods"
    )
    port: int = Field(default=8000, ge=1, le=65535, description="engine HTTP port in each pod")
    scheme: Literal["http", "https"] = Field(default="http", description="engine URL scheme")
    role_label: str = Field(
        default="kvstack.io/role", description="pod label holding the prefill/decode role"
    )
    relist_interval_s: float = Field(
        default=60.0, gt=0, description="full re-list period; repairs anything a watch missed"
    )
    watch_timeout_s: int = Field(
        default=30, ge=1, le=3600, description="server-side timeout of one watch request"
    )
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file; None: in-cluster service account"
    )
    api_url: str | None = Field(
        default=None, description="API server URL without credentials (a local proxy, tests)"
    )


class DiscoveryConfig(Section):
    kind: Literal["static", "kubernetes"] = Field(
        default="static", description="static: the `backends` list; kubernetes: pods by label"
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig, description="pod discovery (kind = kubernetes)"
    )


class HealthConfig(Section):
    interval_s: float = Field(default=2.0, gt=0, description="active health check period")
    timeout_s: float = Field(default=1.0, gt=0, description="timeout of one health check")
    path: str = Field(default="/health", description="health path on each backend")
    unhealthy_after: int = Field(default=2, ge=1, description="consecutive failures to go down")
    healthy_after: int = Field(default=1, ge=1, description="consecutive successes to come back")
    models_interval_s: float = Field(
        default=5.0, gt=0, description="how often each backend's /v1/models is re-read"
    )


class EjectionConfig(Section):
    """Passive ejection: failures seen on real traffic take a backend out for a bounded lease."""

    consecutive_failures: int = Field(
        default=2, ge=1, description="failures in a row (connect, timeout, 5xx) before ejection"
    )
    base_lease_s: float = Field(default=1.0, gt=0, description="first ejection lease")
    max_lease_s: float = Field(
        default=30.0, gt=0, description="lease cap; leases double per repeated ejection"
    )

    @model_validator(mode="after")
    def _order(self) -> EjectionConfig:
        if self.max_lease_s < self.base_lease_s:
            raise ValueError(
                f"max_lease_s ({self.max_lease_s}) must be >= base_lease_s ({self.base_lease_s})"
            )
        return self


class ScrapeConfig(Section):
    enabled: bool = Field(default=True, description="scrape each backend's Prometheus metrics")
    interval_s: float = Field(default=0.5, gt=0, description="scrape period")
    timeout_s: float = Field(default=1.0, gt=0, description="timeout of one scrape")
    stale_after_s: float = Field(
        default=2.0, gt=0, description="scraped figures older than this are ignored"
    )
    path: str = Field(default="/metrics", description="metrics path on each backend")
