"""Figures of the adapter-cache benchmark: per arm and as weighted/LRU ratios."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

from kvstack.bench.lora.run_sim import ArmResult, RequestRecord

__all__ = ["summarise", "write_report"]


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ttft(records: list[RequestRecord]) -> dict[str, float | None]:
    values = [r.ttft_s for r in records if r.ttft_s is not None]
    return {f"p{int(q * 100)}": _quantile(values, q) for q in (0.5, 0.95, 0.99)} | {
        "count": float(len(values))
    }


def _arm(result: ArmResult) -> dict[str, Any]:
    measured = [r for r in result.records if r.after_warmup]
    starts = Counter(r.start for r in measured)
    return {
        "policy": result.policy,
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
        "ttft_interactive_s": _ttft([r for r in measured if r.interactive]),
        "ttft_background_s": _ttft([r for r in measured if not r.interactive]),
        "ttft_interactive_by_tier_p99_s": {
            tier: _ttft([r for r in measured if r.interactive and r.tier == tier])["p99"]
            for tier in ("platinum", "gold", "standard")
        },
        "invariants": result.invariants
        | {"wrong_version_seen_by_client": sum(r.wrong_version for r in result.records)},
        "wall_s": result.wall_s,
    }


def summarise(results: list[ArmResult], params: dict[str, Any]) -> dict[str, Any]:
    arms = {r.policy: _arm(r) for r in results}
    report: dict[str, Any] = {"params": params, "arms": arms}
    w, lru = arms.get("weighted-lru"), arms.get("lru")
    if w and lru:
        p99_w, p99_l = w["ttft_interactive_s"]["p99"], lru["ttft_interactive_s"]["p99"]
        report["comparison"] = {
            "cold_loads_ratio": w["cold_loads"] / max(1, lru["cold_loads"]),
            "cold_loads_reduction": 1 - w["cold_loads"] / max(1, lru["cold_loads"]),
            "ttft_p99_interactive_ratio": p99_w / p99_l if p99_w and p99_l else None,
            "platinum_cold_starts": (w["platinum_cold_starts"], lru["platinum_cold_starts"]),
        }
    return report


def write_report(report: dict[str, Any], out: TextIO) -> None:
    arms = report["arms"]
    rows: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
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
    names = list(arms)
    out.write(f"{'':30}" + "".join(f"{n:>22}" for n in names) + "\n")
    for label, get in rows:
        out.write(f"{label:30}" + "".join(f"{get(arms[n])!s:>22}" for n in names) + "\n")
    cmp_ = report.get("comparison")
    if cmp_:
        out.write(
            f"\nweighted vs LRU: cold loads x{cmp_['cold_loads_ratio']:.2f} "
            f"({100 * cmp_['cold_loads_reduction']:.0f}% fewer; target >= 30%), "
            f"interactive TTFT p99 x{_f(cmp_['ttft_p99_interactive_ratio'])}, "
            f"platinum cold starts {cmp_['platinum_cold_starts'][0]} vs "
            f"{cmp_['platinum_cold_starts'][1]}\n"
        )


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
