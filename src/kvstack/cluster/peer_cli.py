"""``kvstack peer-server``: lend this host's KV tiers to peers without an engine in-process.

    kvstack peer-server [--host 127.0.0.1] [--port 8400] [--tier file:///var/kv?size=100GiB]...

Builds a :class:`~kvstack.kv.KVCache` from the ``kv`` config section (``--tier`` replaces its
tier list) and serves its local tiers — typically the disk tier engines on this host write to.
Settings come from ``index.peer`` (YAML via ``KVSTACK_CONFIG``, ``KVSTACK_INDEX_PEER__*``);
flags override them; the cluster secret from ``security`` (without one: loopback only).
Engines usually embed the server instead (``PeerServer.for_cache``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from kvstack.cluster.config import IndexConfig
from kvstack.errors import ConfigError
from kvstack.section import load_section, log_config_once
from kvstack.security import load_security

__all__ = ["run"]

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvstack peer-server", description="Serve this host's KV tiers to peer engines."
    )
    p.add_argument("--host", help="listen address (index.peer.host)")
    p.add_argument("--port", type=int, help="listen port (index.peer.port)")
    p.add_argument("--max-streams", type=int, help="transfers served at once")
    p.add_argument("--tier", action="append", help="tier URL to serve (repeatable)")
    return p


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    peer = {k: v for k, v in vars(args).items() if v is not None and k != "tier"}
    try:
        index = load_section("index", IndexConfig, {"peer": peer})
        from kvstack.kv import KVCache, KVConfig

        kv = load_section("kv", KVConfig, {"tiers": args.tier} if args.tier else None)
        security, keys = load_security()
    except ConfigError as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 2
    log_config_once("index.peer", index.peer)
    from kvstack.cluster.peer_server import PeerServer

    with KVCache(kv, keys=keys) as cache:
        server = PeerServer.for_cache(cache, index.peer, security)
        try:
            port = server.bind()
        except ConfigError as exc:  # e.g. a public address without the cluster secret
            print(f"kvstack {command}: {exc}", file=sys.stderr)
            return 2
        log.info("peer server lending %s on %s:%d",
                 [t.name for t in server.tiers], index.peer.host, port)  # fmt: skip
        try:
            asyncio.run(server.serve())
        except KeyboardInterrupt:
            pass
    return 0
