"""The result document of ``kvstack bench compare``: every row it prints, with the setup.

``run`` ends with :func:`kvstack.bench.results.save` of :func:`compare_result`; the file is
named after the experiment (``compare-<name>-<UTC stamp>.json``) so that
``results.newest(dir, "compare", variant=name)`` finds one config's newest run. A front end
that could not run at a load point (it did not start, or its run failed) is a row with an
``error`` and no figures, so a table shows the arm and why it is empty.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstack.bench import results
from kvstack.bench.compare.experiment import Experiment
from kvstack.bench.compare.report import Cell

__all__ = ["FailedRun", "cell_row", "compare_result", "default_path", "save_compare"]


@dataclass(frozen=True)
class FailedRun:
    """A front end at one load point that produced no figures, and why."""

    frontend: str
    point: float
    error: str


def cell_row(c: Cell) -> dict[str, Any]:
    """One table row: a front end at one load point (seconds and fractions, unrounded)."""
    o = c.summary.overall
    return {
        "point": c.point,
        "frontend": c.frontend,
        "requests": o.num_requests,
        "ok": o.num_ok,
        "errors": o.num_errors,
        "http_429": o.num_429,
        "request_throughput": o.request_throughput,
        "output_throughput": o.output_throughput,
        "goodput": o.goodput,
        "slo_attainment": o.slo_attainment,
        "ttft_p50_s": o.ttft_s.p50,
        "ttft_p90_s": o.ttft_s.p90,
        "ttft_p99_s": o.ttft_s.p99,
        "tpot_p50_s": o.tpot_s.p50,
        "tpot_p90_s": o.tpot_s.p90,
        "prefix_hit_rate": c.prefix_hit_rate,
        "spread": c.spread,
        "lag_share": c.lag_share,
        "preemptions": c.preemptions,
        "engine_requests": c.engine_requests,
        "errors_by_reason": c.summary.errors_by_reason,
        # Per priority class (lora-zipf's interactive and background), when there are several.
        "by_priority": {
            name: {
                "requests": g.num_requests,
                "goodput": g.goodput,
                "slo_attainment": g.slo_attainment,
                "ttft_p90_s": g.ttft_s.p90,
                "ttft_p99_s": g.ttft_s.p99,
            }
            for name, g in c.summary.by_priority.items()
        }
        if len(c.summary.by_priority) > 1
        else {},
    }


def _fleet(exp: Experiment) -> dict[str, Any]:
    fleet: dict[str, Any] = {
        "kind": exp.fleet.kind,
        "engines": exp.fleet.engines,
        "kv_events": exp.fleet.kv_events,
    }
    if exp.fleet.kind == "sim":
        sim = exp.fleet.sim_config()
        fleet["sim"] = exp.fleet.sim
        fleet["kv_capacity_tokens"] = exp.fleet.engines * sim.num_blocks * sim.block_size
        fleet["time_scale"] = sim.time_scale
    else:
        fleet["vllm"] = exp.fleet.vllm.model_dump(mode="json")
    return fleet


def compare_result(
    exp: Experiment,
    config: Path,
    cells: list[Cell],
    failed: list[FailedRun],
    working_set: int | None,
) -> dict[str, Any]:
    """The ``result`` of a compare run: setup, SLO, fleet and one row per run, in run order."""
    rows = [cell_row(c) for c in cells]
    rows += [{"point": f.point, "frontend": f.frontend, "error": f.error} for f in failed]
    order = {fe.name: i for i, fe in enumerate(exp.frontends)}
    rows.sort(key=lambda r: (r["point"], order.get(r["frontend"], len(order))))
    return {
        "variant": exp.name,
        "config": config.as_posix(),
        "workload": {"name": exp.workload.name, "params": exp.workload.params},
        "working_set_tokens": working_set,
        "load": "rate" if exp.rates is not None else "concurrency",
        "points": exp.points,
        "duration_s": exp.duration_s,
        "seed": exp.seed,
        "slo": {"ttft_s": exp.slo.ttft_s, "tpot_s": exp.slo.tpot_s},
        "fleet": _fleet(exp),
        "frontends": [
            {"name": fe.name, "preset": fe.preset, "command": fe.command} for fe in exp.frontends
        ],
        "rows": rows,
    }


def default_path(variant: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return results.DEFAULT_DIR / "compare" / f"compare-{variant}-{stamp}.json"


def save_compare(
    argv: list[str], result: dict[str, Any], path: Path | None, started: float
) -> Path:
    """Write the result document (``--json FILE``, else the default path named by variant)."""
    out = path or default_path(result["variant"])
    return results.save("compare", argv, result, path=out, started=started)
