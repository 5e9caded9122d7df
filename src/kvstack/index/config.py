"""The index server's own settings and the router's radix tree settings.

- ``IndexServiceConfig``: the ``index.service`` subsection, all the index server reads. The whole
  ``index`` section (service, announce, peer) is :class:`kvstack.cluster.config.IndexConfig`: its
  other subsections configure engines, which the cluster package wires.
- ``RadixConfig``: the router's prefix radix tree (the router's ``prefix.index`` settings).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from kvstack.section import Section

__all__ = ["IndexServiceConfig", "RadixConfig"]


class IndexServiceConfig(Section):
    host: str = Field(
        default="127.0.0.1",
        description="address the index server listens on (HTTP and ZMQ); beyond loopback it "
        "needs security.cluster_secret_file (or security.insecure_no_auth)",
    )
    port: int = Field(default=8300, ge=0, le=65535, description="port of the index server")
    zmq_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="also answer events, lookup and locate over ZMQ on this port (clients use "
        "zmq://host:port; lower latency than HTTP); None: HTTP only",
    )
    instance_ttl_s: float = Field(
        default=30.0,
        gt=0,
        description="forget an instance (and its chunks) when it has not reported for this long",
    )
    max_lookup_tokens: int = Field(
        default=1 << 21, gt=0, description="longest prompt a lookup accepts, in tokens"
    )
    max_body_bytes: int = Field(
        default=32 << 20,
        gt=0,
        description="largest request body (HTTP) or frame (ZMQ); larger ones are refused (413) "
        "before they are read whole",
    )
    max_report_keys: int = Field(
        default=1 << 18,
        gt=0,
        description="chunk keys one report may carry (stored and removed together)",
    )
    max_locate_keys: int = Field(default=1 << 16, gt=0, description="keys one locate may ask")
    max_instances: int = Field(
        default=4096, gt=0, description="engines the index tracks; a new one beyond is refused"
    )
    sweep_batch: int = Field(
        default=50_000,
        gt=0,
        description="index entries cleaned per step after an instance leaves (bounds the pause)",
    )

    @model_validator(mode="after")
    def _distinct_ports(self) -> IndexServiceConfig:
        if self.zmq_port is not None and self.zmq_port == self.port:
            raise ValueError(f"zmq_port must differ from port ({self.port}): both listen on TCP")
        return self


class RadixConfig(Section):
    """The router's token radix tree (:class:`kvstack.index.radix.RadixIndex`)."""

    page_size: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="tokens per page; must divide the engines' KV block size (vLLM's GPU "
        "default is 16, its CPU build 128, kvstack chunks 256)",
    )
    max_tokens: int = Field(
        default=8_000_000,
        gt=0,
        description="bound of the whole tree, in tokens (each costs ~10-40 bytes of memory)",
    )
    routed_capacity_tokens: int | None = Field(
        default=None,
        gt=0,
        description="what the router believes one backend holds, from its own routing; "
        "None: the engine's KV capacity from vllm:cache_config_info, else 1M tokens",
    )
    routed_ttl_s: float | None = Field(
        default=600.0,
        gt=0,
        description="forget a routed prefix not used for this long (engines evict idle "
        "blocks under pressure); None: never",
    )
