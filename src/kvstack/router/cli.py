"""``kvstack router``: run the OpenAI-compatible router.

Settings come from the ``router`` section of ``--config`` (or ``KVSTACK_CONFIG``), then these
flags, then ``KVSTACK_ROUTER_*`` environment variables. Examples::

    kvstack router --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002
    kvstack router --config router.yaml --port 9000 --policy session
    kvstack router --discovery kubernetes --k8s-selector app=vllm --k8s-namespace llm
    kvstack router --backend http://a:8000 --tokenizer llama=/models/llama \
        --kv-event-source http://a:8000=tcp://a:5557 --admission priority

production-stack's router flags work too (``--service-discovery static --static-backends
URL,URL --static-models M,M --routing-logic prefixaware``): :mod:`kvstack.router.cli_aliases`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

from kvstack.errors import ConfigError
from kvstack.router.cli_aliases import add_production_stack_flags, production_stack_settings
from kvstack.router.config import ROUTER_PORT, RouterConfig
from kvstack.router.scheduling.config import POLICIES
from kvstack.section import deep_merge, load_section, log_config_once

if TYPE_CHECKING:
    from kvstack.router.router import Router

__all__ = ["parse_args", "run"]

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack router", description="OpenAI-compatible router")
    p.add_argument("--config", help="YAML file with a `router` section")
    p.add_argument("--host", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help=f"listen port (default {ROUTER_PORT})")
    p.add_argument("--backend", action="append", metavar="URL", help="a backend (repeatable)")
    p.add_argument("--policy", choices=POLICIES, help="routing policy")
    p.add_argument(
        "--model-alias", action="append", metavar="ALIAS=MODEL", help="a model alias (repeatable)"
    )
    p.add_argument("--api-keys-file", help='file of "KEY [TENANT]" lines; enables auth')
    p.add_argument("--discovery", choices=("static", "kubernetes"), help="backend source")
    p.add_argument("--k8s-namespace", help="namespace of the engine pods")
    p.add_argument("--k8s-selector", help="label selector of the engine pods")
    p.add_argument("--k8s-port", type=int, help="engine port in each pod")
    p.add_argument("--max-attempts", type=int, help="attempts per request (retries + 1)")
    p.add_argument(
        "--tokenizer",
        action="append",
        metavar="[MODEL=]SPEC",
        help="prompt tokenizer: a model directory, sim, sim:VOCAB or chars; without MODEL= "
        "the default for every model (repeatable)",
    )
    p.add_argument(
        "--kv-event-source",
        action="append",
        metavar="BACKEND=ENDPOINT",
        help="a backend's KV event endpoint, e.g. http://a:8000=tcp://a:5557 (repeatable)",
    )
    p.add_argument("--kv-events-port", type=int, help="KV events at tcp://<backend host>:PORT")
    p.add_argument("--index-url", help="kvstack index server, for kvstack tier credit")
    p.add_argument("--admission", help="admission plugin: immediate or priority")
    p.add_argument("--seed", type=int, help="seed of random choices")
    add_production_stack_flags(p)
    return p


def parse_args(argv: list[str]) -> tuple[RouterConfig, argparse.Namespace]:
    """The effective config from file, flags and environment (ConfigError if invalid)."""
    args = _parser().parse_args(argv)
    data: dict[str, Any] = {}
    for key in ("host", "port", "policy", "seed"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.backend:
        data["backends"] = [{"url": url} for url in args.backend]
    if args.model_alias:
        data["model_aliases"] = dict(_alias(a) for a in args.model_alias)
    if args.api_keys_file:
        data["auth"] = {"api_keys_file": args.api_keys_file}
    if args.max_attempts is not None:
        data["retry"] = {"max_attempts": args.max_attempts}
    if args.admission:
        data["admission"] = {"name": args.admission}
    prefix = _prefix(args)
    if prefix:
        data["prefix"] = prefix
    discovery = _discovery(args)
    if discovery:
        data["discovery"] = discovery
    data = deep_merge(production_stack_settings(args), data)  # kvstack's own flags win
    return load_section("router", RouterConfig, data, path=args.config), args


def _alias(text: str) -> tuple[str, str]:
    alias, sep, model = text.partition("=")
    if not sep or not alias or not model:
        raise ConfigError(f"--model-alias {text!r} must look like ALIAS=MODEL")
    return alias, model


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for text in values or []:
        key, sep, value = text.rpartition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{flag} {text!r} must look like KEY=VALUE")
        out[key] = value
    return out


def _prefix(args: argparse.Namespace) -> dict[str, Any]:
    prefix: dict[str, Any] = {}
    tokenizers = [t for t in args.tokenizer or [] if "=" in t]
    defaults = [t for t in args.tokenizer or [] if "=" not in t]
    if tokenizers:
        prefix["tokenizers"] = _pairs(tokenizers, "--tokenizer")
    if defaults:
        prefix["default_tokenizer"] = defaults[-1]
    events: dict[str, Any] = {}
    if args.kv_event_source:
        events["sources"] = _event_sources(args.kv_event_source)
    if args.kv_events_port is not None:
        events["port"] = args.kv_events_port
    if events:
        prefix["events"] = events
    if args.index_url:
        prefix["index_url"] = args.index_url
    return prefix


def _event_sources(values: list[str]) -> dict[str, str]:
    """``BACKEND=ENDPOINT``: both sides may hold ``:`` and the backend URL no ``=``."""
    out = {}
    for text in values:
        backend, sep, endpoint = text.partition("=")
        if not sep or not backend or "://" not in endpoint:
            raise ConfigError(f"--kv-event-source {text!r} must look like URL=tcp://HOST:PORT")
        out[backend.rstrip("/")] = endpoint
    return out


def _discovery(args: argparse.Namespace) -> dict[str, Any]:
    kube = {
        key: value
        for key, value in (
            ("namespace", args.k8s_namespace),
            ("label_selector", args.k8s_selector),
            ("port", args.k8s_port),
        )
        if value is not None
    }
    out: dict[str, Any] = {"kubernetes": kube} if kube else {}
    if args.discovery:
        out["kind"] = args.discovery
    return out


def run(command: str, argv: list[str]) -> int:
    try:
        config, args = parse_args(argv)
    except ConfigError as exc:
        print(f"kvstack router: {exc}", file=sys.stderr)
        return 2
    if config.discovery.kind == "static" and not config.backends:
        print("kvstack router: no backends; pass --backend URL or a config file", file=sys.stderr)
        return 2
    log_config_once("router", config)
    from kvstack.procs import tune_gc
    from kvstack.router.http.server import build_server

    try:
        router = _router(config, args.config)
    except ConfigError as exc:
        print(f"kvstack router: {exc}", file=sys.stderr)
        return 2
    server = build_server(config, router)
    tune_gc()
    server.run()
    return 0 if server.started else 1


def _router(config: RouterConfig, path: str | None) -> Router:
    """The router with its LoRA control plane (``lora`` section) and tenancy (``security``
    section, for the tenant salt key) read from the same file as the ``router`` section."""
    from kvstack.router.router import Router
    from kvstack.router.tenancy import Tenancy

    lora = None
    if config.adapters.enabled:
        from kvstack.lora.config import LoRAConfig
        from kvstack.lora.control import LoRAControl

        lora = LoRAControl.from_config(
            load_section("lora", LoRAConfig, path=path),
            engine_api_key=config.auth.upstream_api_key,
        )
    lora_admin = None if lora is None else lora.config.admin_key
    extra = [] if lora_admin is None else [lora_admin.get_secret_value()]
    return Router(config, lora=lora, tenancy=Tenancy.from_environment(config, extra, path))
