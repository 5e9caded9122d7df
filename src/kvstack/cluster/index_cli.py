"""``kvstack index-server``: the cluster KV index service.

    kvstack index-server [--host 127.0.0.1] [--port 8300] [--zmq-port 8301] [--instance-ttl-s 30]

Flags override the ``index.service`` section of the YAML file named by ``KVSTACK_CONFIG`` and
``KVSTACK_INDEX_SERVICE__*`` environment variables. The cluster secret comes from the
``security`` section (``KVSTACK_SECURITY_CLUSTER_SECRET_FILE``); without it the server listens
on loopback only.

It lives in :mod:`kvstack.cluster`, not beside the server in :mod:`kvstack.index`, because it
validates the whole ``index`` section (:class:`~kvstack.cluster.config.IndexConfig`: a config
file's ``index`` section carries ``announce`` and ``peer`` for the engines too); the server
itself takes only ``index.service``.
"""

from __future__ import annotations

import argparse
import sys

from kvstack.cluster.config import IndexConfig
from kvstack.errors import ConfigError
from kvstack.section import load_section, log_config_once
from kvstack.security import load_security

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvstack index-server",
        description="Cluster KV index: where every chunk lives; prefix lookups per engine.",
    )
    p.add_argument("--host", help="listen address (index.service.host)")
    p.add_argument("--port", type=int, help="listen port (index.service.port)")
    p.add_argument(
        "--zmq-port", type=int, help="also answer over ZMQ on this port (index.service.zmq_port)"
    )
    p.add_argument("--instance-ttl-s", type=float, help="forget engines silent this long (seconds)")
    return p


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        config = load_section("index", IndexConfig, {"service": overrides})
        security, keys = load_security()
    except ConfigError as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 2
    log_config_once("index", config)
    from kvstack.index.runner import serve

    try:
        serve(config.service, keys, security)
    except ConfigError as exc:  # e.g. a public address without the cluster secret
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 2
    return 0
