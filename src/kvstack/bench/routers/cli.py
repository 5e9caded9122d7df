"""``kvstack bench routers --config benchmarks/routers/shared-prefix.yaml [--repeats 3]``

Runs a ``bench compare`` experiment whose front ends are 1, 2, 4... router replicas behind a
spreader (:mod:`kvstack.bench.routers.replicas`) ``--repeats`` times, each repeat with the
next workload seed (every arm of a repeat gets the same seed, on a fresh fleet), and reports
for each arm the median and the spread (min-max) of goodput, the engines' prefix-cache hit
rate, TTFT p90 and engine lag, and each arm's ratios to the first arm (the single router)
within the same repeat. The result document goes to ``--json FILE`` (default
``bench-results/routers/routers-<name>-<stamp>.json``), the table to ``<output>/routers.md``,
each repeat's compare output to ``<output>/repeat-<n>/``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstack.bench import results
from kvstack.bench.compare.experiment import Experiment, load_experiment
from kvstack.bench.compare.report import Cell
from kvstack.bench.compare.runner import run_compare
from kvstack.errors import ConfigError

__all__ = ["aggregate", "routers_result", "run"]

FIGURES: dict[str, Callable[[Cell], float]] = {
    "goodput": lambda c: c.summary.overall.goodput,
    "prefix_hit_rate": lambda c: c.prefix_hit_rate,
    "ttft_p90_s": lambda c: c.summary.overall.ttft_s.p90 or 0.0,
    "lag_share": lambda c: c.lag_share,
    "errors": lambda c: float(c.summary.overall.num_errors),
}
RATIOS = ("goodput", "prefix_hit_rate")


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(repeats: list[list[Cell]]) -> dict[str, dict[str, Any]]:
    """Per front end and load point: each figure's values over repeats with median and spread,
    and the ratios of goodput and hit rate to the first front end's at the same load point in
    the same repeat. An arm that did not run in a repeat is left out of that repeat's values
    (``runs`` says how many repeats it has)."""
    out: dict[str, dict[str, Any]] = {}
    keys = list(dict.fromkeys((c.frontend, c.point) for run in repeats for c in run))
    single = keys[0][0] if keys else ""
    for frontend, point in keys:
        pairs = []
        for run in repeats:
            cell = next((c for c in run if (c.frontend, c.point) == (frontend, point)), None)
            base = next((c for c in run if (c.frontend, c.point) == (single, point)), None)
            if cell is not None and base is not None:
                pairs.append((cell, base))
        entry: dict[str, Any] = {"frontend": frontend, "point": point, "runs": len(pairs)}
        for name, read in FIGURES.items():
            values = [read(c) for c, _ in pairs]
            entry[name] = {"values": values, **_stats(values)}
        for name in RATIOS:
            read = FIGURES[name]
            ratios = [read(c) / read(b) if read(b) else 0.0 for c, b in pairs]
            entry[f"{name}_vs_single"] = {"values": ratios, **_stats(ratios)}
        out[f"{frontend} @ {point:g}"] = entry
    return out


def table(name: str, result: dict[str, dict[str, Any]], repeats: int) -> str:
    def cell(entry: dict[str, float], fmt: str) -> str:
        if entry["median"] is None:
            return "did not run"
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
    p.add_argument(
        "--json", type=Path, help="result document (default: bench-results/routers/routers-...)"
    )
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    started = time.time()
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
    failed: list[dict[str, Any]] = []
    for n in range(args.repeats):
        print(f"repeat {n + 1}/{args.repeats} (seed {exp.seed + n})", flush=True)
        seeded = exp.model_copy(update={"seed": exp.seed + n})
        done = run_compare(seeded, out_dir / f"repeat-{n + 1}")
        repeats.append(done.cells)
        failed += [{"repeat": n + 1, **vars(f)} for f in done.failed]
    arms = aggregate(repeats)
    text = table(exp.name, arms, args.repeats)
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "routers.md").write_text(text)
    result = routers_result(exp, args.config, args.repeats, arms, failed)
    variant = exp.name.removeprefix("routers-")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.json or results.DEFAULT_DIR / "routers" / f"routers-{variant}-{stamp}.json"
    results.save("routers", argv, result, path=path, started=started)
    return 0


def routers_result(
    exp: Experiment, config: Path, repeats: int, arms: dict[str, Any], failed: list[Any]
) -> dict[str, Any]:
    """The ``result`` of a routers run: the setup and every arm's figures over the repeats."""
    sim = exp.fleet.sim_config()
    return {
        "variant": exp.name.removeprefix("routers-"),
        "config": config.as_posix(),
        "workload": {"name": exp.workload.name, "params": exp.workload.params},
        "repeats": repeats,
        "seeds": [exp.seed + n for n in range(repeats)],
        "points": exp.points,
        "load": "rate" if exp.rates is not None else "concurrency",
        "duration_s": exp.duration_s,
        "slo": {"ttft_s": exp.slo.ttft_s, "tpot_s": exp.slo.tpot_s},
        "fleet": {
            "kind": exp.fleet.kind,
            "engines": exp.fleet.engines,
            "kv_events": exp.fleet.kv_events,
            "time_scale": sim.time_scale,
            "sim": exp.fleet.sim,
        },
        "arms": arms,
        "failed": failed,
    }
