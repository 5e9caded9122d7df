"""The demo's numbers: load rows, their table (rich), the verdict lines and ``demo.json``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DemoRow", "print_table", "verdicts", "write_json"]


@dataclass
class DemoRow:
    """One workload in one mode: a row of the table, a distribution in the plot, a JSON object."""

    workload: str
    mode: str  # off | on
    requests: int
    errors: int
    ttft_p50_s: float
    ttft_p90_s: float
    output_tokens_per_s: float
    cache_hit_rate: float  # prompt tokens served from vLLM's or kvstack's cache
    ttft_s: list[float] = field(default_factory=list)  # every successful request, sorted


def print_table(rows: Sequence[DemoRow], label: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"load ({label}): two engines behind the router, kvstack off vs on")
    columns = ("workload", "cache", "requests", "errors", "TTFT p50", "TTFT p90",
               "output tok/s", "cache hit rate")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right" if column != "workload" else "left")
    for r in rows:
        table.add_row(
            r.workload, r.mode, str(r.requests), str(r.errors),
            f"{r.ttft_p50_s:.2f} s", f"{r.ttft_p90_s:.2f} s",
            f"{r.output_tokens_per_s:.1f}", f"{r.cache_hit_rate * 100:.0f}%",
        )  # fmt: skip
    Console(width=max(Console().width, 100)).print(table)


def verdicts(rows: Sequence[DemoRow]) -> list[tuple[bool, str]]:
    """Per workload: did cache-on have the lower TTFT p50, and one line saying so (or why not)."""
    out = []
    for workload in dict.fromkeys(r.workload for r in rows):
        by_mode = {r.mode: r for r in rows if r.workload == workload}
        if {"off", "on"} - by_mode.keys():
            continue
        off, on = by_mode["off"], by_mode["on"]
        won = on.ttft_p50_s < off.ttft_p50_s
        out.append((won, _verdict(workload, off, on, won)))
    return out


def _verdict(workload: str, off: DemoRow, on: DemoRow, won: bool) -> str:
    figures = f"TTFT p50 {on.ttft_p50_s:.2f} s with kvstack, {off.ttft_p50_s:.2f} s without"
    if won:
        speedup = off.ttft_p50_s / on.ttft_p50_s if on.ttft_p50_s > 0 else float("inf")
        return f"{workload}: {figures}: {speedup:.1f}x faster"
    hits = (
        f"{on.cache_hit_rate:.0%} of prompt tokens from a cache with kvstack, "
        f"{off.cache_hit_rate:.0%} without"
    )
    if on.cache_hit_rate <= off.cache_hit_rate + 0.05:
        why = "kvstack added few hits: the engines' own caches already held the working set"
    else:
        why = "loading and saving KV cost more than the prefill it saved on these cores"
    return f"{workload}: cache on did NOT win ({figures}; {hits}): {why}"


def write_json(
    path: Path, document: dict[str, Any], rows: Sequence[DemoRow], argv: list[str]
) -> Path:
    """``demo.json``: a flat result file (:mod:`kvstack.bench.results`): the document's keys
    (``story``, ...), the load rows under ``load``, and the command line, commit and machine."""
    from kvstack.bench.results import save

    body = {**document, "load": [asdict(r) for r in rows]}
    return save("demo", argv, body, path, prog=["kvstack", "demo"], quiet=True, flat=True)
