"""Figures of the adapter-cache benchmark: per arm, arm against arm, and over the seeds.

A run's figures (:func:`run_figures`) are per arm (cold loads, platinum cold starts, TTFT after
the warmup fraction, invariants) and per pair of arms (:data:`PAIRS`): kvstack against LRU,
against LRU with the same pins, and the pins alone against LRU. :func:`summarise_runs` gives,
per shape, the median, minimum and maximum of each over the held-out seeds (the tuning seed is
left out: the defaults were chosen on it). Percentages carry one decimal everywhere.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from kvstack.bench.load.stats import percentile
from kvstack.bench.lora.records import ArmResult, RequestRecord
from kvstack.bench.lora.seeds import HELD_OUT, BenchWorkload

__all__ = ["PAIRS", "arm_figures", "run_figures", "summarise_runs", "write_run", "write_summary"]

# (arm, baseline): the comparisons every run reports, where both arms ran.
PAIRS = (("weighted-lru", "lru"), ("weighted-lru", "lru-pins"), ("lru-pins", "lru"))


def _ttft(records: list[RequestRecord]) -> dict[str, float | None]:
    values = [r.ttft_s for r in records if r.ttft_s is not None]
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)} | {"count": float(len(values))}


def arm_figures(result: ArmResult) -> dict[str, Any]:
    measured = [r for r in result.records if r.after_warmup]
    starts = Counter(r.start for r in measured)
    interactive = [r for r in measured if r.interactive]
    return {
        "arm": result.arm,
        "requests_measured": len(measured),
        "cold_loads": result.cold_loads,
        "engine_loads": result.engine_loads,
        "platinum_cold_starts": sum(
            1 for r in measured if r.tier == "platinum" and r.start == "cold"
        ),
        "cold_starts_by_tier": dict(Counter(r.tier for r in measured if r.start == "cold")),
        "starts": {k: starts[k] / max(1, len(measured)) for k in ("hot", "warm", "cold")},
        "actions": dict(Counter(r.action for r in measured)),
        "refusals": dict(Counter(r.reason for r in measured if r.action != "serve")),
        "ttft_interactive_s": _ttft(interactive),
        "ttft_background_s": _ttft([r for r in measured if not r.interactive]),
        "ttft_interactive_by_tier_p99_s": {
            tier: _ttft([r for r in interactive if r.tier == tier])["p99"]
            for tier in ("platinum", "gold", "standard")
        },
        "invariants": result.invariants
        | {"wrong_version_seen_by_client": sum(r.wrong_version for r in result.records)},
        "wall_s": result.wall_s,
    }


def _pair(arm: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    p99, p99_base = arm["ttft_interactive_s"]["p99"], base["ttft_interactive_s"]["p99"]
    return {
        "cold_loads_reduction": 1 - arm["cold_loads"] / max(1, base["cold_loads"]),
        "ttft_p99_interactive_ratio": p99 / p99_base if p99 and p99_base else None,
    }


def run_figures(w: BenchWorkload, arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One workload's figures: its seed, shape and role, each arm's, and each pair's."""
    by_name = {a["arm"]: a for a in arms}
    pairs = {
        f"{a} vs {b}": _pair(by_name[a], by_name[b])
        for a, b in PAIRS
        if a in by_name and b in by_name
    }
    return {"seed": w.seed, "zipf_s": w.zipf_s, "role": w.role, "arms": by_name, "pairs": pairs}


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def _arm_series(runs: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    got = [r["arms"][arm] for r in runs if arm in r["arms"]]
    p99 = [a["ttft_interactive_s"]["p99"] for a in got]
    return {
        "cold_loads": _spread([a["cold_loads"] for a in got]),
        "platinum_cold_starts": _spread([a["platinum_cold_starts"] for a in got]),
        "ttft_interactive_p99_s": _spread([x for x in p99 if x is not None]) if all(p99) else None,
    }


def summarise_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape: medians and spreads over the held-out seeds, per arm and per pair."""
    out: dict[str, Any] = {}
    for shape in dict.fromkeys(f"{r['zipf_s']:g}" for r in runs if r["role"] == HELD_OUT):
        held = [r for r in runs if r["role"] == HELD_OUT and f"{r['zipf_s']:g}" == shape]
        arms = list(dict.fromkeys(a for r in held for a in r["arms"]))
        pairs = list(dict.fromkeys(p for r in held for p in r["pairs"]))
        out[shape] = {
            "seeds": [r["seed"] for r in held],
            "arms": {a: _arm_series(held, a) for a in arms},
            "pairs": {
                p: {
                    k: _spread([v for r in held if (v := r["pairs"][p][k]) is not None])
                    for k in ("cold_loads_reduction", "ttft_p99_interactive_ratio")
                }
                for p in pairs
            },
        }
    return out


def pct(x: float) -> str:
    """A share as a percentage with one decimal: 0.2953 -> ``29.5%``."""
    return f"{100 * x:.1f}%"


_ROWS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("requests measured", lambda a: a["requests_measured"]),
    ("cold loads (store fetches)", lambda a: a["cold_loads"]),
    ("engine loads", lambda a: a["engine_loads"]),
    ("platinum cold starts", lambda a: a["platinum_cold_starts"]),
    (
        "starts hot/warm/cold %",
        lambda a: "/".join(f"{100 * a['starts'][k]:.1f}" for k in ("hot", "warm", "cold")),
    ),
    ("interactive TTFT p50 s", lambda a: _f(a["ttft_interactive_s"]["p50"])),
    ("interactive TTFT p95 s", lambda a: _f(a["ttft_interactive_s"]["p95"])),
    ("interactive TTFT p99 s", lambda a: _f(a["ttft_interactive_s"]["p99"])),
    ("background TTFT p99 s", lambda a: _f(a["ttft_background_s"]["p99"])),
    ("actions", lambda a: ", ".join(f"{k}={v}" for k, v in sorted(a["actions"].items()))),
    ("refusals", lambda a: ", ".join(f"{k}={v}" for k, v in sorted(a["refusals"].items()))),
    ("pinned evictions", lambda a: a["invariants"].get("pinned_eviction")),
    (
        "wrong-version responses",
        lambda a: (
            a["invariants"].get("wrong_version", 0)
            + a["invariants"]["wrong_version_seen_by_client"]
        ),
    ),
    ("unverified loads", lambda a: a["invariants"].get("unverified_load", "n/a")),
    ("wall s", lambda a: f"{a['wall_s']:.0f}"),
]


def write_run(run: dict[str, Any], out: TextIO) -> None:
    """One workload's table, arms side by side, then each pair's ratios."""
    arms = run["arms"]
    out.write(f"\n-- Zipf s={run['zipf_s']:g}, seed {run['seed']} ({run['role']}) --\n")
    out.write(f"{'':30}" + "".join(f"{n:>22}" for n in arms) + "\n")
    for label, get in _ROWS:
        out.write(f"{label:30}" + "".join(f"{get(a)!s:>22}" for a in arms.values()) + "\n")
    for name, p in run["pairs"].items():
        out.write(
            f"{name}: {pct(p['cold_loads_reduction'])} fewer cold loads, "
            f"interactive TTFT p99 x{_f(p['ttft_p99_interactive_ratio'])}\n"
        )


def write_summary(summary: dict[str, Any], out: TextIO) -> None:
    """Medians (min-max) over the held-out seeds, per shape."""
    for shape, s in summary.items():
        out.write(f"\n== held-out seeds {s['seeds']}, Zipf s={shape}: median (min-max) ==\n")
        for name, p in s["pairs"].items():
            c = p["cold_loads_reduction"]
            out.write(
                f"{name}: {pct(c['median'])} fewer cold loads "
                f"({pct(c['min'])} to {pct(c['max'])})\n"
            )
        for arm, a in s["arms"].items():
            plat, p99 = a["platinum_cold_starts"], a["ttft_interactive_p99_s"]
            tail = f", interactive TTFT p99 {_f(p99['median'])} s" if p99 else ""
            out.write(
                f"{arm}: {a['cold_loads']['median']:.0f} cold loads, platinum cold starts "
                f"{plat['median']:g} ({plat['min']:g}-{plat['max']:g}){tail}\n"
            )


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
