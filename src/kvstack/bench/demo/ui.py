"""What the demo shows while it runs: live phases (rich) and its lines of output."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

__all__ = ["DemoConsole"]


class DemoConsole:
    """Prints the demo's lines; ``phase`` shows a live spinner with the elapsed time while a
    step runs (only on a terminal, and not with ``--no-progress``)."""

    def __init__(self, live: bool) -> None:
        self.console = Console(highlight=False)
        self.live = live and sys.stdout.isatty()

    def print(self, text: str = "", style: str | None = None) -> None:
        self.console.print(text, style=style, soft_wrap=True)

    @contextmanager
    def phase(self, description: str) -> Iterator[None]:
        if not self.live:
            yield
            return
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as bar:
            bar.add_task(description, total=None)
            yield

    def step(self, number: int, what: str, seconds: float, note: str = "") -> None:
        """``  2. what ........ 0.31 s  note``: one line per step of the story."""
        dots = "." * max(3, 74 - len(what))
        tail = f"  {note}" if note else ""
        self.print(f"  {number}. {what} {dots} [bold]{seconds:6.2f} s[/bold]{tail}")
