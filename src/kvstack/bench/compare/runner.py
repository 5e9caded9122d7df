"""``kvstack bench compare --config experiment.yaml``: front ends side by side on one fleet.

For every load point and every front end: bring the fleet back to a cold state (a simulated
fleet restarts; real vLLM engines reset their prefix caches), load the workload's adapters,
start the front end, run the same workload with the same seed through it, stop it, and read
the engines' counters. Then write ``table.md``, the plots, one JSON per run with every request
under ``runs/``, and the result document (:mod:`kvstack.bench.compare.record`: ``--json FILE``,
else ``bench-results/compare/compare-<name>-<stamp>.json``). See
:mod:`kvstack.bench.compare.experiment` for the experiment file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvstack.bench.compare.experiment import Experiment, load_experiment
from kvstack.bench.compare.fleet import BenchFleet, make_fleet
from kvstack.bench.compare.frontends import FrontendProcess
from kvstack.bench.compare.record import FailedRun, compare_result, save_compare
from kvstack.bench.compare.report import Cell, plot_all, write_table
from kvstack.bench.config import BenchConfig
from kvstack.bench.load.loadgen import LoadPlan
from kvstack.bench.load.serve import ServeResult, run_serve
from kvstack.bench.load.stats import SLO
from kvstack.bench.workloads import make_workload
from kvstack.bench.workloads.prompts import make_prompt_builder
from kvstack.errors import ConfigError, StackError
from kvstack.section import load_section

__all__ = ["CompareResult", "run", "run_compare"]


@dataclass(frozen=True)
class CompareResult:
    cells: list[Cell]
    out_dir: Path
    table: str
    plots: list[Path]
    failed: list[FailedRun] = field(default_factory=list)
    working_set: int | None = None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def _tokenizer(exp: Experiment, fleet: BenchFleet) -> str:
    if exp.fleet.kind == "sim":
        return "sim"
    from kvstack.bench.compare.fleet import VLLMBenchFleet

    assert isinstance(fleet, VLLMBenchFleet)
    return fleet.model_path


def _plan(exp: Experiment, point: float, config: BenchConfig) -> LoadPlan:
    open_loop = exp.rates is not None
    return LoadPlan(
        rate=point if open_loop else None,
        concurrency=None if open_loop else int(point),
        duration_s=exp.duration_s,
        seed=exp.seed,
        time_scale=exp.fleet.time_scale,
        drain_timeout_s=config.drain_timeout_s,
        timeout_s=config.timeout_s,
    )


def _cell(
    name: str, point: float, fleet: BenchFleet, result: ServeResult, time_scale: float
) -> Cell:
    snaps = fleet.snapshots()
    queries = sum(s.prefix_queries for s in snaps)
    wall_s = result.run.duration_s / time_scale
    return Cell(
        frontend=name,
        point=point,
        summary=result.summary,
        ttfts=[r.ttft_s for r in result.run.results if r.ok and r.ttft_s is not None],
        engine_requests=[s.requests for s in snaps],
        prefix_hit_rate=sum(s.prefix_hits for s in snaps) / queries if queries else 0.0,
        preemptions=sum(s.preemptions for s in snaps),
        lag_share=max((s.lag_s for s in snaps), default=0.0) / wall_s if wall_s else 0.0,
    )


def run_compare(
    exp: Experiment, out_dir: Path, progress: bool = False, config: BenchConfig | None = None
) -> CompareResult:
    config = config or load_section("bench", BenchConfig)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "runs").mkdir(exist_ok=True)
    fleet = make_fleet(exp.fleet, out_dir / "logs", config.start_timeout_s)
    slo = SLO(exp.slo.ttft_s, exp.slo.tpot_s)
    cells: list[Cell] = []
    failed: list[FailedRun] = []
    fleet.start()
    try:
        tokenizer = _tokenizer(exp, fleet)
        probe = make_workload(
            exp.workload.name, exp.workload.params, make_prompt_builder(tokenizer), exp.seed
        )
        adapters = probe.adapters() if exp.fleet.load_adapters else []
        working_set = probe.working_set_tokens()
        _print_setup(exp, fleet, working_set)
        first = True
        for point in exp.points:
            for fe in exp.frontends:
                if not first:
                    fleet.reset()
                first = False
                if adapters:
                    fleet.load_adapters(adapters)
                log_path = out_dir / "logs" / f"{_slug(fe.name)}-{point:g}.log"
                try:
                    with FrontendProcess(fe, fleet, log_path, config.start_timeout_s) as url:
                        result = asyncio.run(
                            run_serve(
                                url,
                                exp.workload.name,
                                exp.workload.params,
                                _plan(exp, point, config),
                                slo,
                                tokenizer,
                                fleet.model,
                                progress=progress,
                            )
                        )
                except StackError as exc:  # this arm did not run: a row that says why
                    failed.append(_failed(fe.name, point, exc, log_path))
                    continue
                run_path = out_dir / "runs" / f"{_slug(fe.name)}-{point:g}.json"
                run_path.write_text(json.dumps(result.document))
                cell = _cell(fe.name, point, fleet, result, exp.fleet.time_scale)
                cells.append(cell)
                _print_cell(cell)
    finally:
        fleet.stop()
    return _write(exp, cells, out_dir, failed, working_set)


def _failed(name: str, point: float, exc: StackError, log_path: Path) -> FailedRun:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    print(f"  {name:<28} load {point:g}: did not run: {reason} (log: {log_path})", flush=True)
    return FailedRun(name, point, reason)


def _load_label(exp: Experiment) -> str:
    return "request rate (req/s)" if exp.rates is not None else "concurrency (users)"


def _write(
    exp: Experiment,
    cells: list[Cell],
    out_dir: Path,
    failed: list[FailedRun],
    working_set: int | None,
) -> CompareResult:
    load = _load_label(exp)
    table = write_table(cells, out_dir / "table.md", load, f"{exp.name}: {exp.workload.name}")
    if failed:
        table += (
            "\n"
            + "\n".join(f"- {f.frontend} at {f.point:g}: did not run: {f.error}" for f in failed)
            + "\n"
        )
        (out_dir / "table.md").write_text(table)
    plots = plot_all(cells, out_dir, load) if cells else []
    return CompareResult(cells, out_dir, table, plots, failed, working_set)


def _print_setup(exp: Experiment, fleet: BenchFleet, working_set: int | None) -> None:
    line = f"fleet: {exp.fleet.engines} {exp.fleet.kind} engine(s) at {fleet.urls[0]}..."
    if exp.fleet.kind == "sim":
        sim = exp.fleet.sim_config()
        capacity = exp.fleet.engines * sim.num_blocks * sim.block_size
        line += f"; KV capacity {capacity} tokens; time scale {sim.time_scale}"
        if working_set:
            line += f"; workload working set {working_set} tokens ({working_set / capacity:.0%})"
    print(line, flush=True)


def _print_cell(c: Cell) -> None:
    o = c.summary.overall
    print(
        f"  {c.frontend:<28} load {c.point:g}: {o.num_ok}/{o.num_requests} ok, "
        f"goodput {o.goodput:.3g}/s, TTFT p90 {o.ttft_s.p90 or 0:.3g} s, "
        f"prefix hits {c.prefix_hit_rate:.0%}, engine lag {c.lag_share:.0%}",
        flush=True,
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench compare", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, type=Path, help="experiment YAML")
    p.add_argument(
        "--output", type=Path, help="output folder (default: bench-results/compare/<name>)"
    )
    p.add_argument("--duration", type=float, help="override duration_s")
    p.add_argument("--frontend", action="append", help="run only these front ends (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--json",
        type=Path,
        help="result document (default: bench-results/compare/compare-<name>-<stamp>.json)",
    )
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    started = time.time()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape otherwise
    try:
        exp = load_experiment(args.config)
        if args.duration:
            exp = exp.model_copy(update={"duration_s": args.duration})
        if args.frontend:
            chosen = [f for f in exp.frontends if f.name in args.frontend]
            missing = set(args.frontend) - {f.name for f in chosen}
            if missing:
                known = [f.name for f in exp.frontends]
                raise ConfigError(f"unknown frontend(s) {sorted(missing)}; known: {known}")
            exp = exp.model_copy(update={"frontends": chosen})
        out_dir = args.output or Path(exp.output_dir or f"bench-results/compare/{exp.name}")
        result = run_compare(exp, out_dir, progress=not args.no_progress)
    except (ConfigError, StackError, ValueError) as exc:
        print(f"kvstack bench compare: {exc}", file=sys.stderr)
        return 2
    print()
    print(result.table)
    print(f"wrote {out_dir}/table.md, " + ", ".join(p.name for p in result.plots))
    document = compare_result(exp, args.config, result.cells, result.failed, result.working_set)
    save_compare(argv, document, args.json, started)
    return 0
