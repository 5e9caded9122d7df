"""``kvstack demo``: the story of :mod:`kvstack.bench.demo.run`, with its errors as one line."""

from __future__ import annotations

import sys

from kvstack.errors import ConfigError, StackError

__all__ = ["run"]


def run(command: str, argv: list[str]) -> int:
    from kvstack.bench.demo.run import run_demo

    try:
        return run_demo(argv)
    except (StackError, ConfigError) as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 1
