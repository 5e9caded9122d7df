"""The README's benchmark table: every region module's ``headline`` rows, in one table.

Each renderer named in :data:`kvstack.bench.report.REGIONS` offers ``headline(results)``: the
rows (what, figure, command) it contributes. A module without committed results contributes
none, so the table shows only what was measured and committed.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from kvstack.bench.report import REGIONS, table

__all__ = ["render"]


def render(results: Path) -> str:
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for name, spec in REGIONS.items():
        module = spec.partition(":")[0]
        if name == "readme" or module in seen:
            continue
        seen.add(module)
        headline = getattr(importlib.import_module(module), "headline", None)
        if headline is not None:
            rows += headline(results)
    if not rows:
        return "_No committed benchmark results yet._"
    rows = [(w, f, c if c.startswith("`") else f"`{c}`") for w, f, c in rows]
    return table(("what", "figure", "command"), rows)
