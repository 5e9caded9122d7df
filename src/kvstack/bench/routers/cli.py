"""``kvstack bench routers --config benchmarks/routers/shared-prefix.yaml [--repeats 3]``

Runs a ``bench compare`` experiment whose front ends are 1, 2, 4... router replicas behind a
spreader (:mod:`kvstack.bench.routers.replicas`) ``--repeats`` times, each repeat with the
next workload seed (every arm of a repeat gets the same seed, on a fresh fleet), and reports
for each arm the median and the spread (min-max) of goodput, the engines' prefix-cache hit
rate, TTFT p90 and engine lag, and each arm's ratios to the first arm (the single router)
within the same repeat. Results go to ``<output>/routers.json`` and ``routers.md``, each
repeat's compare output to ``<output>/repeat-<n>/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstack.bench.compare.experiment import load_experiment
from kvstack.bench.compare.report import Cell
from kvstack.bench.compare.runner import run_compare
from kvstack.errors import ConfigError

__all__ = ["aggregate", "run"]

FIGURES: dict[str, Callable[[Cell], float]] = {
    "goodput": lambda c: c.summary.overall.goodput,
    "prefix_hit_rate": lambda c: c.prefix_hit_rate,
    "ttft_p90_s": lambda c: c.summary.overall.ttft_s.p90 or 0.0,
    "lag_share": lambda c: c.lag_share,
    "errors": lambda c: float(c.summary.overall.num_errors),
}
RATIOS = ("goodput", "prefix_hit_rate")


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(repeats: list[list[Cell]]) -> dict[str, dict[str, Any]]:
    """Per front end and load point: each figure's values over repeats with median and spread,
    and the ratios of goodput and hit rate to the first front end's at the same load point in
    the same repeat."""
    out: dict[str, dict[str, Any]] = {}
    for first in repeats[0]:
        key = (first.frontend, first.point)
        cells = [next(c for c in run if (c.frontend, c.point) == key) for run in repeats]
        bases = [next(c for c in run if c.point == first.point) for run in repeats]
        entry: dict[str, Any] = {"frontend": first.frontend, "point": first.point}
        for name, read in FIGURES.items():
            values = [read(c) for c in cells]
            entry[name] = {"values": values, **_stats(values)}
        for name in RATIOS:
            read = FIGURES[name]
            ratios = [
                read(c) / read(b) if read(b) else 0.0 for c, b in zip(cells, bases, strict=True)
            ]
            entry[f"{name}_vs_single"] = {"values": ratios, **_stats(ratios)}
        out[f"{first.frontend} @ {first.point:g}"] = entry
    return out


def table(name: str, result: dict[str, dict[str, Any]], repeats: int) -> str:
    def cell(entry: dict[str, float], fmt: str) -> str:
        return f"{entry['median']:{fmt}} ({entry['min']:{fmt}}-{entry['max']:{fmt}})"

    lines = [
        f"### {name}: medians over {repeats} repeats (min-max)",
        "",
        "| front end | goodput (req/s) | prefix hits | hits vs single | goodput vs single "
        "| TTFT p90 (s) | engine lag | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arm, e in result.items():
        lines.append(
            f"| {arm} | {cell(e['goodput'], '.2f')} | {cell(e['prefix_hit_rate'], '.1%')} "
            f"| {cell(e['prefix_hit_rate_vs_single'], '.2f')} "
            f"| {cell(e['goodput_vs_single'], '.2f')} | {cell(e['ttft_p90_s'], '.2f')} "
            f"| {cell(e['lag_share'], '.0%')} | {e['errors']['max']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench routers", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, type=Path, help="a bench compare experiment")
    p.add_argument("--repeats", type=int, default=3, help="runs of every arm (median, spread)")
    p.add_argument("--duration", type=float, help="override duration_s")
    p.add_argument("--output", type=Path, help="default: bench-results/routers/<name>")
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        exp = load_experiment(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.duration:
        exp = exp.model_copy(update={"duration_s": args.duration})
    out_dir = args.output or Path(f"bench-results/routers/{exp.name}")
    repeats: list[list[Cell]] = []
    for n in range(args.repeats):
        print(f"repeat {n + 1}/{args.repeats} (seed {exp.seed + n})", flush=True)
        seeded = exp.model_copy(update={"seed": exp.seed + n})
        repeats.append(run_compare(seeded, out_dir / f"repeat-{n + 1}").cells)
    result = aggregate(repeats)
    text = table(exp.name, result, args.repeats)
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "routers.md").write_text(text)
    document = {"experiment": exp.model_dump(mode="json"), "repeats": args.repeats,
                "command": ["kvstack", "bench", "routers", *argv], "arms": result}  # fmt: skip
    (out_dir / "routers.json").write_text(json.dumps(document, indent=1))
    return 0
