"""``kvstack epp``: run the endpoint picker (an Envoy ext_proc gRPC server).

The decision is configured by the ``router`` section of ``--config`` (the same keys as
``kvstack router``), the listener and the Kubernetes resources by its ``epp`` section, the
authentication by its ``security`` section. Flags win over the file, ``KVSTACK_*`` variables
over both. Examples::

    kvstack epp --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 --port 9002
    kvstack epp --config epp.yaml                       # epp.pool.name: an InferencePool
    kvstack epp --config epp.yaml --write-token /run/epp-token   # the gateway's bearer token
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from kvstack.errors import ConfigError
from kvstack.procs import tune_gc
from kvstack.router.config import RouterConfig
from kvstack.router.epp.config import EppConfig
from kvstack.router.scheduling.config import POLICIES
from kvstack.section import load_section, log_config_once
from kvstack.security import SecurityConfig, load_keys

__all__ = ["run"]

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack epp", description="Envoy ext_proc endpoint picker")
    p.add_argument("--config", help="YAML file with `router`, `epp` and `security` sections")
    p.add_argument("--backend", action="append", metavar="URL", help="a backend (repeatable)")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="ext_proc gRPC port (default 9002)")
    p.add_argument("--health-port", type=int, help="plaintext gRPC health port (0: off)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (0: off)")
    p.add_argument("--pool", help="InferencePool to follow (Kubernetes)")
    p.add_argument("--namespace", help="namespace of the pool")
    p.add_argument("--policy", choices=POLICIES, help="routing policy (router.policy)")
    p.add_argument("--admission", help="admission plugin: immediate or priority")
    p.add_argument("--self-signed-tls", action="store_true", help="serve TLS as GIE's EPP does")
    p.add_argument(
        "--write-token", metavar="FILE", help="write the gateway's bearer token (mode 0600), exit"
    )
    return p


def parse_args(argv: list[str]) -> tuple[RouterConfig, EppConfig, SecurityConfig, Any]:
    args = _parser().parse_args(argv)
    router: dict[str, Any] = {}
    if args.backend:
        router["backends"] = [{"url": url} for url in args.backend]
    if args.policy:
        router["policy"] = args.policy
    if args.admission:
        router["admission"] = {"name": args.admission}
    epp: dict[str, Any] = {
        key: value
        for key, value in (
            ("host", args.host), ("port", args.port), ("health_port", args.health_port),
            ("metrics_port", args.metrics_port),
        )
        if value is not None
    }  # fmt: skip
    pool = {k: v for k, v in (("name", args.pool), ("namespace", args.namespace)) if v}
    if pool:
        epp["pool"] = pool
    if args.self_signed_tls:
        epp["tls"] = {"self_signed": True}
    return (
        load_section("router", RouterConfig, router, path=args.config),
        load_section("epp", EppConfig, epp, path=args.config),
        load_section("security", SecurityConfig, path=args.config),
        args,
    )


def run(command: str, argv: list[str]) -> int:
    try:
        router, epp, security, args = parse_args(argv)
        if args.write_token:
            return _write_token(security, Path(args.write_token))
        if epp.pool.name is None and router.discovery.kind == "static" and not router.backends:
            raise ConfigError("no backends; pass --backend URL, --pool NAME or a config file")
    except ConfigError as exc:
        print(f"kvstack epp: {exc}", file=sys.stderr)
        return 2
    log_config_once("router", router)
    log_config_once("epp", epp)
    lora = None
    if router.adapters.enabled:
        from kvstack.lora.config import LoRAConfig
        from kvstack.lora.control import LoRAControl

        lora = LoRAControl.from_config(load_section("lora", LoRAConfig, path=args.config))
    from kvstack.router.epp.build import build_epp

    try:
        asyncio.run(_serve(build_epp(router, epp, security, lora)))
    except ConfigError as exc:
        print(f"kvstack epp: {exc}", file=sys.stderr)
        return 2
    return 0


async def _serve(server: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await server.start()
    tune_gc()  # as the router does: a decision allocates as a proxied request does
    try:
        await stop.wait()
    finally:
        await server.stop()


def _write_token(security: SecurityConfig, path: Path) -> int:
    from kvstack.router.epp.server import epp_token

    keys = load_keys(security)
    if keys is None:
        raise ConfigError("--write-token needs security.cluster_secret_file (the token is "
                          "derived from it)")  # fmt: skip
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(epp_token(keys) + "\n")
    print(f"kvstack epp: token written to {path}", file=sys.stderr)
    return 0
