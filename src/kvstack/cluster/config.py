"""The ``index`` config section: where KV chunks live across the cluster.

- ``service``: the cluster KV index server (``kvstack index-server``); its model stays with the
  server (:class:`kvstack.index.config.IndexServiceConfig`).
- ``announce``: how a kvstack-enabled engine reports its chunks to that server.
- ``peer``: the peer server through which an engine lends its CPU/disk chunks to other engines.

Why the section lives here and not in ``kvstack.index``: two of its three subsections configure
what this package runs in an engine (the announcer and the peer server), and the index server
needs only its own subsection. The keys and ``KVSTACK_INDEX_*`` variables are unchanged. The
``kvstack index-server`` command reads the whole section (a config file's ``index`` section
carries all three), so it lives here too (:mod:`kvstack.cluster.index_cli`).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from kvstack.index.config import IndexServiceConfig
from kvstack.index.urls import check_index_url
from kvstack.section import Section

__all__ = ["AnnounceConfig", "IndexConfig", "PeerServerConfig"]


def _check_host_port(value: str, what: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{what} must be host:port with a port in [0, 65535], got {value!r}")
    return value


class AnnounceConfig(Section):
    index_url: str = Field(
        default="",
        description="the cluster KV index: the index server at http://index:8300 or "
        "zmq://index:8301 (its zmq_port), or Valkey at redis://host:6379 or rediss://host:6379 "
        "(?cluster=true, ?sentinel=NAME; see docs/cluster-kv.md); empty: do not announce",
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
    host: str = Field(
        default="127.0.0.1",
        description="address the peer server listens on; beyond loopback it needs "
        "security.cluster_secret_file (or security.insecure_no_auth)",
    )
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
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="deadline of every read and write on a connection (a client that trickles "
        "a request or stops reading an answer is cut off), and its idle timeout",
    )
    max_connections: int = Field(
        default=256, gt=0, description="connections held at once; more are refused"
    )
    max_connections_per_peer: int = Field(
        default=32, gt=0, description="connections held at once from one client address"
    )


class IndexConfig(Section):
    service: IndexServiceConfig = Field(default_factory=IndexServiceConfig)
    announce: AnnounceConfig = Field(default_factory=AnnounceConfig)
    peer: PeerServerConfig = Field(default_factory=PeerServerConfig)
