"""A rich progress bar for the load generator (plain silence when stdout is not a terminal)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from kvstack.bench.load.loadgen import Progress

__all__ = ["progress_bar"]


@contextmanager
def progress_bar(label: str, enabled: bool = True) -> Iterator[Progress | None]:
    """Yields a ``Progress`` callback (or None when disabled or not on a terminal)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn(
            "sent {task.fields[sent]}  done {task.fields[done]}  "
            "errors {task.fields[errors]}  in flight {task.fields[inflight]}"
        ),
        TimeElapsedColumn(),
    )
    with RichProgress(*columns, transient=True) as bar:
        task = bar.add_task(label, total=1.0, sent=0, done=0, errors=0, inflight=0)

        def update(sent: int, done: int, errors: int, fraction: float) -> None:
            bar.update(
                task, completed=fraction, sent=sent, done=done, errors=errors, inflight=sent - done
            )

        yield update
