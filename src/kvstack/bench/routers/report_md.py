"""The published tables of ``kvstack bench routers``, rendered from its committed results.

One section per committed config (``benchmarks/results/routers/routers-<name>-*.json``, the
newest of each): the command line as run, the setup, the run's machine and commit, and every
arm's median over the repeats with its spread (min–max), beside its ratios to the single router
within the same repeat.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import num, stale_line, table
from kvstack.bench.results import Result, load, newest

__all__ = ["headline", "render"]

ORDER = ("shared-prefix", "multi-round-qa")
HEADERS = (
    "front end",
    "goodput/s",
    "prefix hits",
    "hits vs single",
    "goodput vs single",
    "TTFT p90 s",
    "engine lag",
    "errors",
    "repeats",
)


def _variants(results: Path) -> list[str]:
    names = {load(p).result.get("variant") for p in (results / "routers").glob("routers-*.json")}
    found = sorted(n for n in names if isinstance(n, str))
    return [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]


def _m(entry: dict[str, Any], kind: str = "num") -> str:
    if entry.get("median") is None:
        return "did not run"

    def f(x: float) -> str:
        if kind == "pct":
            return f"{x:.1%}"
        if kind == "ratio":
            return f"{x:.2f}×"
        return num(x)

    return f"{f(entry['median'])} ({f(entry['min'])}–{f(entry['max'])})"


def _rows(arms: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, e in arms.items():
        errors = e["errors"]["max"]
        rows.append(
            (
                name,
                _m(e["goodput"]),
                _m(e["prefix_hit_rate"], "pct"),
                _m(e["prefix_hit_rate_vs_single"], "ratio"),
                _m(e["goodput_vs_single"], "ratio"),
                _m(e["ttft_p90_s"]),
                _m(e["lag_share"], "pct"),
                "–" if errors is None else f"{errors:.0f}",
                f"{e.get('runs', '?')}",
            )
        )
    return rows


def _setup(res: dict[str, Any]) -> str:
    fleet, slo = res["fleet"], res["slo"]
    unit = "req/s" if res["load"] == "rate" else "users"
    seeds = ", ".join(str(s) for s in res["seeds"])
    return (
        f"{fleet['engines']} {fleet['kind']} engines (time scale {fleet['time_scale']:g}"
        f"{', KV events on' if fleet['kv_events'] else ''}); workload "
        f"`{res['workload']['name']}` at {', '.join(f'{p:g}' for p in res['points'])} {unit}, "
        f"{res['duration_s']:g} s per arm, {res['repeats']} repeats (seeds {seeds}); SLO "
        f"TTFT ≤ {num(slo['ttft_s'])} s and TPOT ≤ {num(slo['tpot_s'])} s. Medians over the "
        "repeats, (min–max); the ratios compare each arm with the single router in the same "
        "repeat."
    )


def _section(r: Result) -> str:
    res = r.result
    parts = [f"### {res['variant']} — `{r.command}`", "", _setup(res), "", stale_line(r), ""]
    parts.append(table(HEADERS, _rows(res["arms"]), "lrrrrrrrr"))
    for f in res.get("failed", []):
        parts += [
            "",
            f"- {f['frontend']} at {f['point']:g}, repeat {f['repeat']}: did not run: {f['error']}",
        ]
    return "\n".join(parts)


def render(results: Path) -> str:
    found = [newest(results, "routers", variant=v) for v in _variants(results)]
    sections = [_section(r) for r in found if r is not None]
    if not sections:
        return "_No committed result of `kvstack bench routers` yet._"
    return "\n\n".join(sections)


def headline(results: Path) -> list[tuple[str, str, str]]:
    """README row (shared-prefix): the most replicas sharing soft state against one router."""
    r = newest(results, "routers", variant="shared-prefix")
    if r is None:
        return []
    arms = r.result["arms"]
    shared = [k for k in arms if "shared" in k and arms[k]["goodput"]["median"] is not None]
    if not shared:
        return []
    e = arms[shared[-1]]
    what = f"router replicas, shared-prefix: {shared[-1]} against one router"
    figure = (
        f"goodput {_m(e['goodput_vs_single'], 'ratio')}, prefix hits "
        f"{_m(e['prefix_hit_rate_vs_single'], 'ratio')} (medians of {r.result['repeats']})"
    )
    return [(what, figure, r.command)]
