"""The ``kvstack`` command. Each subcommand lives in its package and is imported only when run,
so ``kvstack router`` never imports torch and ``kvstack --help`` is instant.

A subcommand module exposes ``run(command: str, argv: list[str]) -> int``.
"""

from __future__ import annotations

import importlib
import sys

from kvstack import __version__
from kvstack.errors import MissingExtraError
from kvstack.extras import extra_for, missing_extra

__all__ = ["main"]

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("kvstack.bench.cli", "benchmarks: kv, serve, compare, vllm, router, index"),
    "plan": (
        "kvstack.bench.plan.cli",
        "decide whether KV tiers pay off for a workload and hardware",
    ),
    "sim-engine": ("kvstack.sim.cli", "run a simulated vLLM-compatible engine"),
    "router": ("kvstack.router.cli", "run the OpenAI-compatible router"),
    "epp": ("kvstack.router.epp.cli", "run the router's brain as a Gateway API endpoint picker"),
    "index-server": ("kvstack.cluster.index_cli", "run the cluster KV index service"),
    "peer-server": ("kvstack.cluster.peer_cli", "serve local KV tiers to peers"),
    "security": ("kvstack.cluster.secret_cli", "create a cluster secret (init-secret PATH)"),
    "adapters": ("kvstack.lora.cli", "manage the LoRA adapter registry"),
    "up": ("kvstack.stack.cli", "start a local stack from a config file"),
    "down": ("kvstack.stack.cli", "stop a running local stack"),
    "demo": ("kvstack.bench.demo.cli", "run the end-to-end demo (cache off vs on)"),
    "deploy": ("kvstack.deploy.cli", "render the Helm chart for review"),
    "config": ("kvstack.config_cli", "print the effective configuration or its reference"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: kvstack <command> [options]   (kvstack {__version__})", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'kvstack <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(__version__)
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"kvstack: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from kvstack.log import setup_logging

    setup_logging()
    try:
        module = importlib.import_module(COMMANDS[command][0])
        result: int = module.run(command, rest)
    except MissingExtraError as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if extra_for(exc) is None:
            raise
        print(f"kvstack {command}: {missing_extra(exc, f'kvstack {command}')}", file=sys.stderr)
        return 2
    return result
