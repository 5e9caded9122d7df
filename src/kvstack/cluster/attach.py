"""attach_cluster: what one engine runs to share KV across the cluster, from the ``index``
config section — a :class:`~kvstack.cluster.peer_server.PeerServer` lending its local tiers (when
``index.peer.enabled``) and an :class:`~kvstack.cluster.announcer.Announcer` reporting its chunks
and its peer address to the index service (when ``index.announce.index_url`` is set)::

    link = attach_cluster(cache, load_section("index", IndexConfig), instance_id=engine_id)
    ...
    link.close()

The cluster secret is the cache's (``KVCache(..., keys=...)``): the peer server challenges its
clients with it and the announcer signs its reports.

With tensor parallelism each rank has its own cache and keys: pass ``rank``; rank ``r > 0``
lends on ``port + r`` and announces as ``<instance_id>#rank<r>`` (a reset from one rank must not
erase another's chunks). Routers look up rank 0's keys, so rank 0 stands for the engine.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

from kvstack.cluster.announcer import Announcer
from kvstack.cluster.config import IndexConfig

if TYPE_CHECKING:
    from kvstack.cluster.peer_server import PeerServer
    from kvstack.kv.cache import KVCache
    from kvstack.security import SecurityConfig

__all__ = ["ClusterLink", "attach_cluster"]

log = logging.getLogger(__name__)


class ClusterLink:
    def __init__(self, server: PeerServer | None, announcer: Announcer | None) -> None:
        self.server = server
        self.announcer = announcer

    def close(self) -> None:
        if self.announcer is not None:
            self.announcer.close()
        if self.server is not None:
            self.server.stop()


def advertised_address(config: IndexConfig, port: int) -> str:
    """``announce.peer_address`` (its port replaced when it is 0), else this host and port."""
    configured = config.announce.peer_address
    if configured:
        host, _, configured_port = configured.rpartition(":")
        return f"{host}:{port}" if configured_port == "0" else configured
    host = config.peer.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"{host}:{port}"


def attach_cluster(
    cache: KVCache,
    config: IndexConfig,
    instance_id: str = "",
    rank: int = 0,
    security: SecurityConfig | None = None,
) -> ClusterLink:
    """Start what ``config`` enables for ``cache``; a link whose parts may be None. Both
    authenticate with the cache's cluster keys; without keys the peer server binds loopback
    only, unless ``security.insecure_no_auth``."""
    server = None
    announce = config.announce
    if config.peer.enabled:
        from kvstack.cluster.peer_server import PeerServer

        peer = config.peer
        if peer.port:
            peer = peer.model_copy(update={"port": peer.port + rank})
        server = PeerServer.for_cache(cache, peer, security)
        port = server.start_background()
        announce = announce.model_copy(update={"peer_address": advertised_address(config, port)})
        log.info("lending KV tiers %s to peers on port %d", [t.name for t in server.tiers], port)
    announcer = None
    if announce.index_url:
        name = instance_id or announce.instance_id
        if name and rank:
            name = f"{name}#rank{rank}"
        if name:
            announce = announce.model_copy(update={"instance_id": name})
        announcer = Announcer(cache, announce).start()
    return ClusterLink(server, announcer)
