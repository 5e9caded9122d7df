"""The scenarios of ``kvstack bench vllm`` beyond TTFT: choose one with ``--scenario``.

=============== ====================================================================== ==========
scenario        what it measures                                                        module
=============== ====================================================================== ==========
interference    decode ITL p50/p99 while others load long prefixes from slow tiers     interference
multi-turn      turn two on another instance, with and without generated-token saving turns
preemption      recomputed tokens under preemption, with and without the connector     turns
overhead        paired interleaved TTFT on unique prompts, copy-out on / off the step  paired
pipelining      paired interleaved CPU-tier hit TTFT, layer pipelining off / on        paired
=============== ====================================================================== ==========

Each prints a table and saves every sample as a result file (:func:`kvstack.bench.results.save`:
``--json FILE``, else ``bench-results/vllm/vllm-<scenario>-<stamp>.json``). ``--quick`` runs the
tiny model and short prompts (a smoke run); figures come from the ~150M model. ``overhead``
runs plain vLLM against the connector's defaults; ``--background-arm`` adds a third engine with
``copy_out: background`` (each idle CPU engine beside the measured one slows it down).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from kvstack.bench import results as bench_results
from kvstack.bench.micro.vllm_harness import Engines
from kvstack.bench.micro.vllm_probe import PromptFactory

__all__ = ["SCENARIOS", "run_scenario"]

SCENARIOS = ("interference", "multi-turn", "preemption", "overhead", "pipelining")


def run_scenario(
    args: argparse.Namespace, argv: list[str], model: Path, work: Path, started: float
) -> Path:
    """Measure ``args.scenario``, print its table, save the result file; returns its path."""
    engines = Engines(model, work, max_model_len=max(16384, args.prompt_tokens + 256))
    prompts = PromptFactory(seed=args.seed)
    results = _measure(args, engines, prompts)
    results["scenario"] = args.scenario
    results["args"] = _args(args) | {"model": model.name}
    print_rows(args.scenario, results)
    path = args.json or default_path(args.scenario)
    return bench_results.save("vllm", argv, results, path=path, started=started)


def default_path(scenario: str) -> Path:
    """Where a scenario's result goes without ``--json``: named by the scenario (its variant)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return bench_results.DEFAULT_DIR / "vllm" / f"vllm-{scenario}-{stamp}.json"


def _args(args: argparse.Namespace) -> dict[str, Any]:
    keep = ("quick", "prompt_tokens", "reps", "seed", "skip", "scenario", "preempt_blocks",
            "background_arm", "poll_s", "finish_wait", "file_readers",
            "load_fetch")  # fmt: skip
    return {k: getattr(args, k) for k in keep if hasattr(args, k)}


def _measure(args: argparse.Namespace, engines: Engines, prompts: PromptFactory) -> dict[str, Any]:
    if args.scenario == "interference":
        from kvstack.bench.micro.vllm_harness import drop_page_cache
        from kvstack.bench.micro.vllm_interference import interference

        quiet = 2.0 if args.quick else 4.0
        return interference(
            engines, prompts, args.prompt_tokens, args.reps, quiet, drop_page_cache, args.poll_s,
            args.finish_wait, args.file_readers, args.load_fetch,
        )  # fmt: skip
    if args.scenario == "multi-turn":
        from kvstack.bench.micro.vllm_turns import multi_turn

        turn_one = 1000 if args.quick else 3000
        return multi_turn(engines, prompts, turn_one, 100 if args.quick else 400, args.reps)
    if args.scenario == "preemption":
        from kvstack.bench.micro.vllm_turns import preemption

        return preemption(engines, prompts, args.preempt_blocks, args.reps)
    from kvstack.bench.micro.vllm_paired import overhead, pipelining

    tokens = max(args.prompt_tokens // 4, 256)
    if args.scenario == "overhead":
        # Two engines unless asked: every idle CPU engine beside the measured one takes cycles
        return overhead(engines, prompts, tokens, args.reps, background=args.background_arm)
    return pipelining(engines, prompts, tokens, args.reps)


def print_rows(scenario: str, results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    if scenario == "interference":
        from kvstack.bench.micro.vllm_interference import report_rows

        columns = [
            "arm",
            "loader TTFT",
            "ITL p50/p99 ms, no load",
            "during load",
            "p99 ratio",
            "in flight p99 ratio",
        ]
        rows = report_rows(results)
    else:
        columns, rows = ["measure", "median [min-max]"], list(_flat_rows(results))
    table = Table(title=f"kvstack bench vllm --scenario {scenario}")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _flat_rows(results: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for key, value in results.items():
        if key in ("rounds", "samples_s") or not isinstance(value, dict):
            continue
        if key == "connector":
            for arm, figures in value.items():
                rows += [(f"{arm}.{k}", f"{v:.4g}") for k, v in figures.items()]
            continue
        if {"median", "min", "max"} <= value.keys():
            ci = value.get("interval95")
            rows.append((
                f"{prefix}{key}",
                f"{value['median']:.4g} [{value['min']:.4g}-{value['max']:.4g}] n={value['n']}"
                + (f", 95% interval {ci['low']:.4g}-{ci['high']:.4g}" if ci else ""),
            ))  # fmt: skip
        else:
            rows += _flat_rows(value, f"{prefix}{key}.")
    return rows
