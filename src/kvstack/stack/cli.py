"""``kvstack up`` and ``kvstack down`` (``kvstack demo`` lives in :mod:`kvstack.bench.demo`)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from kvstack.errors import ConfigError, StackError
from kvstack.section import load_section
from kvstack.security import load_security
from kvstack.stack.config import StackConfig
from kvstack.stack.cores import format_cpu_list
from kvstack.stack.supervisor import Stack, stop_run_dir

__all__ = ["run"]


def _up(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvstack up", description="Start a local kvstack stack.")
    p.add_argument(
        "--config", help="YAML file with a `stack` section (default: 2 simulated engines)"
    )
    p.add_argument("--run-dir", help="logs, state and local tiers (overrides stack.run_dir)")
    p.add_argument(
        "--detach", action="store_true", help="return once healthy; stop with 'kvstack down'"
    )
    p.add_argument(
        "--no-progress", action="store_true", help="plain log lines instead of a live display"
    )
    args = p.parse_args(argv)
    config = load_section("stack", StackConfig, path=args.config)
    security, _ = load_security(path=args.config)
    stack = Stack(config, Path(args.run_dir) if args.run_dir else None, security)
    stack.start(show_progress=not args.no_progress)
    for c in stack.components:
        cores = f"  computes on cores {format_cpu_list(c.cores)}" if c.cores else ""
        print(f"{c.name:>16}  {c.url}{cores}")
    if stack.core_plan is not None:
        print(stack.core_plan.summary())
    print(f"logs in {stack.run_dir / 'logs'}")
    if args.detach:
        stack.processes.clear()  # leave them running; 'kvstack down' reads the state file
        return 0
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print("stack is up; Ctrl-C stops it")
    try:
        while not done.wait(1.0):
            dead = [n for n, proc in stack.processes.items() if not proc.alive()]
            if dead:
                print(f"component(s) exited: {', '.join(dead)}; stopping", file=sys.stderr)
                return 1
    finally:
        stack.stop()
    return 0


def _down(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvstack down", description="Stop a stack started by 'kvstack up'."
    )
    p.add_argument("--config", help="the stack's YAML file (for its run_dir)")
    p.add_argument("--run-dir", help="the stack's run directory")
    args = p.parse_args(argv)
    run_dir = args.run_dir or load_section("stack", StackConfig, path=args.config).run_dir
    names = stop_run_dir(Path(run_dir))
    print(f"stopped {', '.join(names) or 'nothing'}")
    return 0


def run(command: str, argv: list[str]) -> int:
    verbs = {"up": _up, "down": _down}
    try:
        return verbs[command](argv)
    except (StackError, ConfigError) as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 1
