"""``kvstack up`` and ``kvstack down`` (``kvstack demo`` lives in :mod:`kvstack.bench.demo`).

Both print lines for people: ``up`` one per component (name, URL, cores) and where the logs
are, ``down`` what it stopped. With ``--json`` each prints one JSON document instead, for
scripts: ``{"run_dir", "logs", "components": [{"name", "kind", "url", "cores"}], "core_plan"}``
and ``{"run_dir", "stopped": [...]}``; ``up`` then shows no live display and says the rest on
stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from kvstack.errors import ConfigError, StackError
from kvstack.output import add_json_flag, print_json
from kvstack.section import load_section
from kvstack.security import load_security
from kvstack.stack.config import StackConfig
from kvstack.stack.cores import format_cpu_list
from kvstack.stack.supervisor import STATE_FILE, Stack, stop_run_dir

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
    add_json_flag(p)
    args = p.parse_args(argv)
    config = load_section("stack", StackConfig, path=args.config)
    security, _ = load_security(path=args.config)
    stack = Stack(config, Path(args.run_dir) if args.run_dir else None, security)
    stack.start(show_progress=not (args.no_progress or args.json))
    if args.json:
        print_json(_started(stack))
    else:
        _print_started(stack)
    _remember(stack.run_dir)
    if args.detach:
        stack.processes.clear()  # leave them running; 'kvstack down' reads the state file
        return 0
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print("stack is up; Ctrl-C stops it", file=sys.stderr if args.json else sys.stdout)
    try:
        while not done.wait(1.0):
            dead = [n for n, proc in stack.processes.items() if not proc.alive()]
            if dead:
                print(f"component(s) exited: {', '.join(dead)}; stopping", file=sys.stderr)
                return 1
    finally:
        stack.stop()
    return 0


def _print_started(stack: Stack) -> None:
    for c in stack.components:
        cores = f"  computes on cores {format_cpu_list(c.cores)}" if c.cores else ""
        print(f"{c.name:>16}  {c.url}{cores}")
    if stack.core_plan is not None:
        print(stack.core_plan.summary())
    print(f"logs in {stack.run_dir / 'logs'}")


def _started(stack: Stack) -> dict[str, object]:
    components = [
        {"name": c.name, "kind": c.kind, "url": c.url, "cores": list(c.cores)}
        for c in stack.components
    ]
    plan = stack.core_plan.summary() if stack.core_plan is not None else None
    return {"run_dir": str(stack.run_dir), "logs": str(stack.run_dir / "logs"),
            "components": components, "core_plan": plan}  # fmt: skip


def _down(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvstack down", description="Stop a stack started by 'kvstack up'."
    )
    p.add_argument("--config", help="the stack's YAML file (for its run_dir)")
    p.add_argument("--run-dir", help="the stack's run directory")
    add_json_flag(p)
    args = p.parse_args(argv)
    if args.run_dir or args.config:
        run_dir = Path(args.run_dir or load_section("stack", StackConfig, path=args.config).run_dir)
    else:
        run_dir = _find_running()
    names = stop_run_dir(run_dir)
    if _remembered() == run_dir.resolve():
        _last_stack_file().unlink(missing_ok=True)
    if args.json:
        return print_json({"run_dir": str(run_dir), "stopped": names})
    print(f"stopped {', '.join(names) or 'nothing'}")
    return 0


def _last_stack_file() -> Path:
    """Where ``kvstack up`` notes its run directory, for a ``kvstack down`` without flags
    from another directory or shell: the user's state directory (XDG), not the project."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kvstack" / "last-stack"


def _remember(run_dir: Path) -> None:
    path = _last_stack_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(run_dir.resolve()) + "\n")


def _remembered() -> Path | None:
    try:
        text = _last_stack_file().read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def _find_running() -> Path:
    """The stack of the default config (``KVSTACK_CONFIG`` or ``.kvstack/run``) when one runs
    there, else the one ``kvstack up`` last started; otherwise say which flag to pass."""
    default = Path(load_section("stack", StackConfig).run_dir)
    candidates = [default, *filter(None, [_remembered()])]
    for run_dir in candidates:
        if (run_dir / STATE_FILE).exists():
            return run_dir
    looked = " or ".join(str(c) for c in dict.fromkeys(candidates))
    raise StackError(
        f"no running stack in {looked}; pass --run-dir DIR (the stack's run_dir) or "
        "--config FILE (the file given to 'kvstack up')"
    )


def run(command: str, argv: list[str]) -> int:
    verbs = {"up": _up, "down": _down}
    try:
        return verbs[command](argv)
    except (StackError, ConfigError) as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 1
