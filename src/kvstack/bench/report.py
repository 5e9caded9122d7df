"""``kvstack bench report [--check] [--results DIR]``: the published tables, from result files.

``docs/benchmarks.md`` and ``README.md`` hold generated regions::

    <!-- bench-report:kv -->
    ...a table rendered from benchmarks/results/kv/...
    <!-- /bench-report:kv -->

``report`` re-renders every region from the committed results under ``benchmarks/results/``
(:mod:`kvstack.bench.results`), so no published figure is typed by hand; ``--check`` changes
nothing and exits 1, naming the region, when a file is out of date with its results (the
consistency test runs it). Each region's renderer lives beside its benchmark and is named in
:data:`REGIONS`; it returns Markdown and reads the results it needs with
:func:`kvstack.bench.results.newest`.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kvstack.bench.results import Result

__all__ = [
    "OWN_FORMAT",
    "REGIONS",
    "TARGETS",
    "num",
    "regions_in",
    "render_all",
    "render_commands",
    "run",
    "stale_line",
    "table",
    "target",
]

ROOT = Path(__file__).resolve().parents[3]
RESULTS = Path("benchmarks/results")
# Result folders in their own format, not kvstack bench results: the GPU check runs on machines
# without kvstack installed (benchmarks/gpu/check.py; benchmarks/results/gpu/README.md).
OWN_FORMAT = frozenset({"gpu"})
TARGETS = (Path("docs/benchmarks.md"), Path("README.md"), Path("benchmarks/README.md"))

# region name -> "module:function"; the function takes the results folder, returns Markdown.
# A region's module also has ``headline(results) -> list[(what, figure, command)]``: its rows of
# the README's benchmark table (``readme``).
REGIONS: dict[str, str] = {
    "demo": "kvstack.bench.demo.report_md:render",
    "kv": "kvstack.bench.micro.kv_report:render",
    "vllm": "kvstack.bench.micro.vllm_report:render",
    "fetch": "kvstack.bench.micro.fetch_step_report:render",
    "vllm-scenarios": "kvstack.bench.micro.vllm_report:render_scenarios",
    "sim": "kvstack.bench.micro.sim_report:render",
    "router": "kvstack.bench.micro.router_report:render",
    "compare": "kvstack.bench.compare.report_md:render",
    "routers": "kvstack.bench.routers.report_md:render",
    "radix": "kvstack.bench.micro.radix_report:render",
    "shared": "kvstack.bench.micro.shared_report:render",
    "lora": "kvstack.bench.lora.report_md:render",
    "epp": "kvstack.bench.micro.epp_report:render",
    "gpu": "kvstack.bench.micro.gpu_report:render_md",
    "index": "kvstack.bench.micro.index_report:render",
    "readme": "kvstack.bench.readme_table:render",
    "commands": "kvstack.bench.report:render_commands",
}

_REGION = re.compile(
    r"(<!-- bench-report:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /bench-report:(?P=name) -->)",
    re.S,
)


def num(x: float) -> str:
    """A figure to three significant digits, never in exponent form: ``5,076``, ``47.0``."""
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}" if x else "0"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A Markdown table; ``align`` has one letter per column, ``l`` or ``r`` (default ``l``)."""
    align = align.ljust(len(headers), "l")
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def target(met: bool | None, bar: str) -> str:
    """The target column's cell: the bar and whether this run met it."""
    if met is None:
        return bar
    return f"{bar}: met" if met else f"{bar}: **missed**"


def stale_line(result: Result) -> str:
    """One line naming the run (command, commit, day, machine) and, if stale, why."""
    m = result.machine
    machine = ", ".join(
        str(x)
        for x in (
            m.get("cpu_model"),
            f"{m['cores']} cores" if m.get("cores") else None,
            f"memcpy {m['memcpy_gbps']} GB/s" if m.get("memcpy_gbps") else None,
            f"loopback TCP {m['loopback_gbps']} GB/s" if m.get("loopback_gbps") else None,
        )
        if x
    )
    posix, mark = result.path.as_posix(), "benchmarks/results/"
    where = f"`{posix[posix.find(mark) :] if mark in posix else posix}`"
    text = f"Measured {result.day} at commit `{result.commit}` with `{result.command}` ({where}"
    text += f"; {machine})." if machine else ")."
    if result.provenance == "transcribed":
        text += " The raw run was not kept: these figures are transcribed from the earlier doc."
    if result.stale:
        text += f" **Stale:** {result.stale}"
    return text


def render_commands(results: Path) -> str:
    """Every committed result's command line exactly as it ran, with its file and commit."""
    from kvstack.bench.results import load

    rows = []
    for path in sorted(results.glob("*/*.json")):
        if path.parent.name in OWN_FORMAT:
            continue
        r = load(path)
        posix = path.as_posix()
        rel = (
            posix[posix.find("benchmarks/results/") :] if "benchmarks/results/" in posix else posix
        )
        note = "transcribed" if r.provenance == "transcribed" else ""
        if r.stale:
            note = (note + ", " if note else "") + "stale"
        rows.append((f"`{r.command}`", f"`{rel}`", r.day, f"`{r.commit}`", note))
    if not rows:
        return "_No committed results yet._"
    return table(("command, exactly as run", "result", "measured", "commit", "note"), rows)


def _renderer(spec: str) -> Callable[[Path], str]:
    module, _, name = spec.partition(":")
    fn: Callable[[Path], str] = getattr(importlib.import_module(module), name)
    return fn


def regions_in(text: str) -> list[str]:
    return [m.group("name") for m in _REGION.finditer(text)]


def render_all(text: str, results: Path) -> tuple[str, list[str]]:
    """``text`` with each region re-rendered; also the regions that changed."""
    changed: list[str] = []

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in REGIONS:
            raise SystemExit(f"bench report: unknown region {name!r} (known: {', '.join(REGIONS)})")
        body = _renderer(REGIONS[name])(results).rstrip("\n") + "\n"
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return _REGION.sub(one, text), changed


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvstack bench report", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if out of date")
    p.add_argument("--results", type=Path, default=None, help=f"default: {RESULTS}")
    p.add_argument("--root", type=Path, default=None, help="the checkout (default: this one)")
    args = p.parse_args(argv)
    root = args.root or (Path.cwd() if (Path.cwd() / RESULTS).is_dir() else ROOT)
    results = args.results or root / RESULTS
    stale = []
    for rel in TARGETS:
        path = root / rel
        if not path.exists():
            continue
        text = path.read_text()
        new, changed = render_all(text, results)
        if changed and args.check:
            stale += [f"{rel}: {name}" for name in changed]
        elif changed:
            path.write_text(new)
            print(f"{rel}: regenerated {', '.join(changed)}")
    if stale:
        print("bench report: out of date with benchmarks/results (run `kvstack bench report`):")
        print("\n".join(f"  {s}" for s in stale))
        return 1
    if args.check:
        print("bench report: every region matches its results")
    return 0
