"""``kvstack sim-engine``: serve simulated vLLM engines.

    kvstack sim-engine --port 8100 --model sim-model [--time-scale 10] [--num-blocks 4096] ...
    kvstack sim-engine --fleet 16 --base-port 8100 --time-scale 10 ...

Every field of the ``sim`` config section is a flag (``--max-num-seqs``, ``--enable-lora``,
``--kv-events-endpoint``, ``--kv-tiers URL`` repeated, …); flags override the YAML file named
by ``KVSTACK_CONFIG`` and ``KVSTACK_SIM_*`` environment variables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
import typing
from typing import Any

from kvstack.errors import ConfigError
from kvstack.section import load_section, log_config_once
from kvstack.sim.config import SimConfig

__all__ = ["build_parser", "run"]


def _flag_kwargs(annotation: Any) -> dict[str, Any]:
    """argparse options for one config field, from its type annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is list:
        return {"action": "append", "type": str}
    if origin is typing.Literal:
        return {"choices": list(args)}
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return {"type": args[0]}
    if annotation in (int, float, str):
        return {"type": annotation}
    return {"type": str}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvstack sim-engine",
        description="A simulated vLLM engine (OpenAI API, vLLM metrics and KV events).",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument("--port", type=int, default=8000, help="port (of the first engine)")
    p.add_argument("--fleet", type=int, default=1, help="engines in this process")
    p.add_argument("--base-port", type=int, default=None, help="fleet: first port (--port)")
    p.add_argument("--served-model-name", dest="model_alias", help="vLLM's name for --model")
    p.add_argument(
        "--kv-events-config",
        help='vLLM\'s JSON form, e.g. \'{"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://*:5557", "topic": "kv"}\'',
    )
    group = p.add_argument_group("engine (the 'sim' config section)")
    for name, field in SimConfig.model_fields.items():
        kwargs = _flag_kwargs(field.annotation)
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=field.description,
            **kwargs,
        )
    return p


_EVENT_KEYS = {
    "endpoint": "kv_events_endpoint",
    "replay_endpoint": "kv_events_replay_endpoint",
    "topic": "kv_events_topic",
    "buffer_steps": "kv_events_buffer_steps",
}


def _vllm_aliases(args: argparse.Namespace) -> dict[str, Any]:
    """Flags spelled as vLLM spells them, so a vLLM launch line works with few changes."""
    out: dict[str, Any] = {}
    if args.api_key is None and os.environ.get("VLLM_API_KEY"):
        out["api_key"] = os.environ["VLLM_API_KEY"]  # vLLM's way to keep it off the command line
    if args.model_alias:
        out["model"] = args.model_alias
    if args.kv_events_config:
        try:
            events = json.loads(args.kv_events_config)
        except ValueError as exc:
            raise ConfigError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(events, dict):
            raise ConfigError("--kv-events-config must be a JSON object")
        if events.get("enable_kv_cache_events", True) and events.get("publisher", "zmq") == "zmq":
            out["kv_events_endpoint"] = events.get("endpoint", "tcp://*:5557")
            out |= {ours: events[key] for key, ours in _EVENT_KEYS.items() if key in events}
    return out


def run(command: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    overrides = {
        name: getattr(args, name)
        for name in SimConfig.model_fields
        if getattr(args, name) is not None
    }
    try:
        overrides |= _vllm_aliases(args)
        config = load_section("sim", SimConfig, overrides)
        if args.fleet < 1:
            raise ConfigError(f"--fleet must be >= 1, got {args.fleet}")
        if config.kv_tiers:
            from kvstack.sim.tier import tier_config

            tier_config(config)  # a bad tier URL is named before the server starts
        from kvstack.sim.server import fleet_specs, run_fleet

        port = args.base_port if args.base_port is not None else args.port
        specs = fleet_specs(config, args.fleet, port, args.host)
    except (ConfigError, ValueError) as exc:
        print(f"kvstack sim-engine: {exc}", file=sys.stderr)
        return 2
    log_config_once("sim", config)
    run_fleet(specs)
    return 0
