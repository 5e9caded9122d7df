"""Configuration of the ``index`` section: where KV chunks live across the cluster.

- ``service``: the cluster KV index server (``kvstack index-server``).
- ``announce``: how a kvstack-enabled engine reports its chunks to that server.
- ``peer``: the peer server through which an engine lends its CPU/disk chunks to other engines.

- ``RadixConfig``: the router's prefix radix tree (the router's ``prefix.index`` settings).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from kvstack.index.urls import check_index_url
from kvstack.section import Section

__all__ = [
    "AnnounceConfig",
    "IndexConfig",
    "IndexServiceConfig",
    "PeerServerConfig",
    "RadixConfig",
]


def _check_host_port(value: str, what: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{what} must be host:port with a port in [0, 65535], got {value!r}")
    return value


class IndexServiceConfig(Section):
    host: str = Field(default="127.0.0.1", description="address the index server listens on")
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


class AnnounceConfig(Section):
    index_url: str = Field(
        default="",
        description="index server URL, http://index:8300 or zmq://index:8301 (its zmq_port); "
        "empty: do not announce",
    )
    instance_id: str = Field(
        default="", description="this engine's id in the index; empty: hostname:pid"
    )
    served_model_names: list[str] = Field(
        default_factory=list,
        description="names clients use for the model (the router looks up by these)",
    )
    peer_address: str = Field(
        default="", description="host:port where this engine's peer server is reachable"
    )
    interval_s: float = Field(default=0.05, gt=0, description="batching interval of events")
    heartbeat_s: float = Field(
        default=5.0, gt=0, description="report at least this often, even without events"
    )
    timeout_s: float = Field(default=2.0, gt=0, description="timeout of one report")
    max_batch_keys: int = Field(
        default=65_536, gt=0, description="keys per report (a full sync is split into reports)"
    )
    max_pending_keys: int = Field(
        default=1 << 20,
        gt=0,
        description="events kept while the index is unreachable; beyond this, a full sync "
        "is sent when it is back",
    )
    sync_shared_tiers: bool = Field(
        default=True,
        description="list shared tiers (redis, s3) in a full sync, not just local ones",
    )

    @field_validator("peer_address")
    @classmethod
    def _peer(cls, value: str) -> str:
        return _check_host_port(value, "announce.peer_address") if value else value

    @field_validator("index_url")
    @classmethod
    def _index_url(cls, value: str) -> str:
        return check_index_url(value) if value else value


class PeerServerConfig(Section):
    enabled: bool = Field(
        default=False, description="lend this engine's CPU/disk chunks to peer engines"
    )
    host: str = Field(default="0.0.0.0", description="address the peer server listens on")
    port: int = Field(default=8400, ge=0, le=65535, description="port of the peer server (0: any)")
    max_streams: int = Field(
        default=4,
        gt=0,
        description="chunk transfers served at once; more concurrent requests are answered "
        "'busy' at once (the peer falls back to its next tier) instead of queueing",
    )
    max_keys_per_request: int = Field(
        default=4096, gt=0, description="largest batch one request may name"
    )
    timeout_s: float = Field(default=10.0, gt=0, description="idle timeout of a connection")


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


class IndexConfig(Section):
    service: IndexServiceConfig = Field(default_factory=IndexServiceConfig)
    announce: AnnounceConfig = Field(default_factory=AnnounceConfig)
    peer: PeerServerConfig = Field(default_factory=PeerServerConfig)
