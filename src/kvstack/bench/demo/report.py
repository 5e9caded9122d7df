"""The demo's rows, its table (rich) and its plot (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DemoRow", "plot", "print_table"]


@dataclass
class DemoRow:
    """One workload in one mode: a row of the table, two bars of the plot, one JSON object."""

    workload: str
    mode: str  # off | on
    requests: int
    errors: int
    ttft_p50_s: float
    ttft_p90_s: float
    output_tokens_per_s: float
    cache_hit_rate: float  # prompt tokens served from vLLM's or kvstack's cache


def print_table(rows: Sequence[DemoRow], label: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kvstack demo ({label}): the kvstack cache off vs on")
    for column in (
        "workload",
        "cache",
        "requests",
        "errors",
        "TTFT p50",
        "TTFT p90",
        "output tok/s",
        "cache hit rate",
    ):
        table.add_column(column, justify="right" if column != "workload" else "left")
    for r in rows:
        table.add_row(
            r.workload, r.mode, str(r.requests), str(r.errors),
            f"{r.ttft_p50_s * 1000:.0f} ms", f"{r.ttft_p90_s * 1000:.0f} ms",
            f"{r.output_tokens_per_s:.1f}", f"{r.cache_hit_rate * 100:.0f}%",
        )  # fmt: skip
    Console(width=max(Console().width, 110)).print(table)


def plot(rows: Sequence[DemoRow], path: Path, label: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        chosen = [r for r in rows if r.workload == workload]
        modes = [r.mode for r in chosen]
        x = range(len(chosen))
        ax.bar([i - 0.2 for i in x], [r.ttft_p50_s for r in chosen], 0.4, label="TTFT p50")
        ax.bar([i + 0.2 for i in x], [r.ttft_p90_s for r in chosen], 0.4, label="TTFT p90")
        ax.set_xticks(list(x), [f"cache {m}" for m in modes])
        ax.set_ylabel("seconds")
        ax.set_title(workload)
        ax.legend()
    fig.suptitle(f"kvstack demo: TTFT with the kvstack cache off and on ({label})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
