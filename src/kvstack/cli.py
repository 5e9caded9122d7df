"""The ``kvstack`` command. Each subcommand lives in its package and is imported only when run,
so ``kvstack router`` never imports torch and ``kvstack --help`` is instant.

A subcommand module exposes ``run(command: str, argv: list[str]) -> int``.

Errors a user can fix (kvstack's own, config validation, a server that is not there) end as one
line on stderr naming the cause and the fix; ``--debug`` (or ``KVSTACK_DEBUG=1``) shows the
traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys

from kvstack import __version__
from kvstack.errors import ConfigError, KVStackError, MissingExtraError
from kvstack.extras import extra_for, missing_extra

__all__ = ["main", "one_line_error"]

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
    lines += ["--debug (or KVSTACK_DEBUG=1) shows the traceback of an error."]
    return "\n".join(lines)


def one_line_error(exc: BaseException) -> str | None:
    """The error as one line with its cause and fix; None for a bug (shown as a traceback)."""
    if isinstance(exc, ConfigError):
        return f"{exc}; see 'kvstack config reference' for the keys"
    if isinstance(exc, KVStackError):
        return str(exc)
    if _is_validation_error(exc):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            for err in exc.errors()  # type: ignore[attr-defined]
        )
        return f"invalid configuration: {problems}"
    target = _connect_target(exc)
    if target is not None:
        return f"cannot connect to {target}: connection refused; is the server up at that URL?"
    return None


def _is_validation_error(exc: BaseException) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(exc, pydantic.ValidationError)


def _connect_target(exc: BaseException) -> str | None:
    """The address a refused connection went to (httpx, aiohttp or a plain socket)."""
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.ConnectError):
        try:
            return str(exc.request.url)
        except RuntimeError:  # raised without a request
            return str(exc)
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientConnectorError):
        return f"{exc.host}:{exc.port}"
    if isinstance(exc, ConnectionRefusedError):
        return str(exc.filename or exc.strerror or exc)
    return None


def _wants_debug(args: list[str]) -> bool:
    return "--debug" in args or os.environ.get("KVSTACK_DEBUG", "") in ("1", "true", "yes")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    debug = _wants_debug(args)
    args = [a for a in args if a != "--debug"]
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
    except Exception as exc:  # the process boundary: one line for what the user can fix
        line = one_line_error(exc)
        if line is None or debug:
            raise
        print(f"kvstack {command}: {line} (--debug shows the traceback)", file=sys.stderr)
        return 1
    return result
