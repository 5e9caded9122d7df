"""``bench compare`` output: a markdown table and PNG plots (matplotlib, Agg backend).

- ``table.md``: one row per (load point, front end): requests, errors, 429s, throughput,
  goodput and SLO attainment, TTFT and TPOT percentiles, the engines' prefix-cache hit rate,
  the load spread (max / mean requests per engine) and the simulator's lag (the largest share
  of the run an engine spent behind its schedule for want of CPU; above a few percent the row
  describes this machine's load more than the front end, and a warning follows the table);
- ``ttft_cdf.png``: TTFT CDF per front end, one panel per load point;
- ``throughput_vs_rate.png``: output tokens/s and goodput against the load;
- ``ttft_p90_vs_rate.png``: TTFT p90 against the load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstack.bench.load.report_text import fmt
from kvstack.bench.load.stats import RunSummary

__all__ = ["Cell", "plot_all", "write_table"]


@dataclass
class Cell:
    """One run: a front end at one load point."""

    frontend: str
    point: float
    summary: RunSummary
    ttfts: list[float]
    engine_requests: list[float] = field(default_factory=list)
    prefix_hit_rate: float = 0.0
    preemptions: float = 0.0
    lag_share: float = 0.0  # max over engines: wall seconds behind schedule / run wall time

    @property
    def spread(self) -> float | None:
        total = sum(self.engine_requests)
        if not self.engine_requests or total == 0:
            return None
        return max(self.engine_requests) / (total / len(self.engine_requests))


LAG_WARNING = 0.05
_HEADER = (
    "| {load} | front end | requests | errors | 429 | req/s | out tok/s | goodput/s | in SLO "
    "| TTFT p50 | TTFT p90 | TTFT p99 | TPOT p50 | TPOT p90 | prefix hits | spread | lag |"
)


def write_table(cells: Sequence[Cell], path: Path, load: str, title: str) -> str:
    rows = [f"# {title}", "", _HEADER.format(load=load), "|" + "---|" * 17]
    for c in sorted(cells, key=lambda c: c.point):
        o = c.summary.overall
        rows.append(
            f"| {fmt(c.point)} | {c.frontend} | {o.num_requests} | {o.num_errors} | {o.num_429} "
            f"| {fmt(o.request_throughput)} | {fmt(o.output_throughput)} | {fmt(o.goodput)} "
            f"| {o.slo_attainment:.0%} | {fmt(o.ttft_s.p50)} | {fmt(o.ttft_s.p90)} "
            f"| {fmt(o.ttft_s.p99)} | {fmt(o.tpot_s.p50)} | {fmt(o.tpot_s.p90)} "
            f"| {c.prefix_hit_rate:.0%} | {fmt(c.spread)} | {c.lag_share:.0%} |"
        )
    lagging = [c for c in cells if c.lag_share > LAG_WARNING]
    if lagging:
        worst = max(c.lag_share for c in lagging)
        rows += ["", f"**Warning**: in {len(lagging)} of {len(cells)} runs a simulated engine "
                 f"fell behind its schedule for more than {LAG_WARNING:.0%} of the run (worst "
                 f"{worst:.0%}): this machine lacked the CPU for the fleet, the front end and the "
                 "load generator at this time scale; those rows measure the machine. Lower the "
                 "time scale or the rates, or run on quieter CPUs."]  # fmt: skip
    text = "\n".join(rows) + "\n"
    path.write_text(text)
    return text


def _frontends(cells: Sequence[Cell]) -> list[str]:
    return list(dict.fromkeys(c.frontend for c in cells))


def plot_all(cells: Sequence[Cell], out_dir: Path, load: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [_ttft_cdf(plt, cells, out_dir), _vs_rate(plt, cells, out_dir, load)]
    paths.append(_p90_vs_rate(plt, cells, out_dir, load))
    plt.close("all")
    return paths


def _ttft_cdf(plt: Any, cells: Sequence[Cell], out_dir: Path) -> Path:
    points = sorted({c.point for c in cells})
    cols = min(3, len(points))
    rows = -(-len(points) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(points) :]:
        ax.set_visible(False)
    for ax, point in zip(flat, points, strict=False):
        for c in (c for c in cells if c.point == point):
            values = sorted(c.ttfts)
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, fractions, where="post", label=c.frontend)
        ax.set_xscale("log")
        ax.set_title(f"load {fmt(point)}")
        ax.set_xlabel("time to first token (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    path = out_dir / "ttft_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _series(cells: Sequence[Cell], name: str) -> list[Cell]:
    return sorted((c for c in cells if c.frontend == name), key=lambda c: c.point)


def _vs_rate(plt: Any, cells: Sequence[Cell], out_dir: Path, load: str) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in _frontends(cells):
        series = _series(cells, name)
        xs = [c.point for c in series]
        left.plot(xs, [c.summary.overall.output_throughput for c in series], "o-", label=name)
        right.plot(xs, [c.summary.overall.goodput for c in series], "o-", label=name)
    for ax, ylabel in ((left, "output tokens/s"), (right, "goodput (requests/s in SLO)")):
        ax.set_xlabel(load)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    path = out_dir / "throughput_vs_rate.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _p90_vs_rate(plt: Any, cells: Sequence[Cell], out_dir: Path, load: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in _frontends(cells):
        series = [c for c in _series(cells, name) if c.summary.overall.ttft_s.p90 is not None]
        ax.plot(
            [c.point for c in series],
            [c.summary.overall.ttft_s.p90 for c in series],
            "o-",
            label=name,
        )
    ax.set_yscale("log")
    ax.set_xlabel(load)
    ax.set_ylabel("TTFT p90 (s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = out_dir / "ttft_p90_vs_rate.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
