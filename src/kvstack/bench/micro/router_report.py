"""The published table of ``kvstack bench router``, rendered from its committed result.

Every run's added latency (the router's percentile minus the upstream's own, paired per round)
and maximum throughput, for the kvstack router and vllm-router measured in the same rounds,
then the median over runs; the targets are the kvstack router's, judged in every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import stale_line, table, target
from kvstack.bench.results import newest

__all__ = ["BARS", "headline", "markdown", "render"]

BARS = {"added_p50_ms": 1.0, "added_p99_ms": 5.0, "req_per_s": 2000.0}  # the bars
_OTHER = "vllm-router"


def _latency(f: dict[str, Any] | None) -> str:
    return f"{f['added_p50_ms']:.3f} / {f['added_p99_ms']:.3f}" if f else "not run"


def _rps(x: float | None) -> str:
    return f"{x:,.0f}" if x is not None else "not run"


def _targets(kv: dict[str, float]) -> str:
    return "; ".join(
        (
            target(kv["added_p50_ms"] <= BARS["added_p50_ms"], "p50 ≤ 1 ms"),
            target(kv["added_p99_ms"] <= BARS["added_p99_ms"], "p99 ≤ 5 ms"),
            target(kv["req_per_s"] >= BARS["req_per_s"], f"≥ {BARS['req_per_s']:,.0f} req/s"),
        )
    )


def _flat(router: dict[str, Any]) -> dict[str, float]:
    return {"added_p50_ms": router["added_p50_ms"], "added_p99_ms": router["added_p99_ms"],
            "req_per_s": router["throughput"]["req_per_s"]}  # fmt: skip


def _span(values: list[float], fmt: str = "{:.0f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"


def _times(a: float, b: float) -> str:
    """a / b as a ratio, or why there is none (an added latency can be zero or negative)."""
    return f"{a / b:.2f}×" if b > 0 else "no ratio (vllm-router's figure is not positive)"


def _rows(document: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for i, run in enumerate(document["runs"], 1):
        kv, other = _flat(run["routers"]["kvstack"]), run["routers"].get(_OTHER)
        load = run["load_average"]
        rows.append(
            (str(i), _latency(kv), _rps(kv["req_per_s"]),
             _latency(_flat(other) if other else None),
             _rps(other["throughput"]["req_per_s"] if other else None),
             f"{load['before']:.1f}–{load['after']:.1f}", _targets(kv))
        )  # fmt: skip
    med, other = document["median"]["kvstack"], document["median"].get(_OTHER)
    rows.append(
        ("**median**", f"**{_latency(med)}**", f"**{_rps(med['req_per_s'])}**", _latency(other),
         _rps(other["req_per_s"] if other else None), "", _targets(med))
    )  # fmt: skip
    return rows


def _comparison(document: dict[str, Any]) -> str:
    runs, med = document["runs"], document["median"]
    own = [r["kvstack_internal_added"]["p99_le_ms"] for r in runs]
    cpu = [r["routers"]["kvstack"]["throughput"]["cpu_us_per_req"].get("kvstack") for r in runs]
    text = (
        "The kvstack router's own histogram of added latency puts its p99 at ≤ "
        f"{_span(own, '{:g}')} ms (bucket bounds, per run), against "
        f"{med['kvstack']['added_p99_ms']:.3f} ms added at the client (median over runs)."
    )
    if _OTHER not in med:
        return text
    kv, other = med["kvstack"], med[_OTHER]
    theirs = [r["routers"][_OTHER]["throughput"]["cpu_us_per_req"].get(_OTHER) for r in runs]
    return (
        f"Against vllm-router (Rust), medians over runs: added p50 "
        f"{_times(kv['added_p50_ms'], other['added_p50_ms'])}, added p99 "
        f"{_times(kv['added_p99_ms'], other['added_p99_ms'])}, throughput "
        f"{_times(kv['req_per_s'], other['req_per_s'])}; the router process's CPU per request in "
        f"the closed loop {_span([c for c in cpu if c])} µs against "
        f"{_span([c for c in theirs if c])} µs. " + text
    )


def markdown(document: dict[str, Any]) -> str:
    """The runs' table and the comparison of one result."""
    s = document["settings"]
    tool = document["runs"][0]["routers"]["kvstack"]["throughput"].get("tool") or "a load tool"
    headers = ("run", "kvstack added p50 / p99 ms", "kvstack max req/s",
               "vllm-router added p50 / p99 ms", "vllm-router max req/s", "load average",
               "target (kvstack)")  # fmt: skip
    return "\n".join(
        [
            f"Trivial upstream on loopback, {s['rounds']} interleaved rounds of {s['round_s']:g} s "
            f"per measurement, `{s['policy']}` in both routers, non-streaming; added latency in "
            f"an open loop at {s['rate']:g} req/s, max req/s in a closed loop of "
            f"{s['connections']} connections ({tool}); {len(document['runs'])} runs, each with "
            "fresh processes (load average before–after each run):",
            "",
            table(headers, _rows(document), "lrrrrll"),
            "",
            _comparison(document),
        ]
    )


def render(results: Path) -> str:
    r = newest(results, "router")
    if r is None:
        return "_No committed result of `kvstack bench router` yet._"
    return stale_line(r) + "\n\n" + markdown(r.result)


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "router")
    if r is None:
        return []
    kv, other = r.result["median"]["kvstack"], r.result["median"].get(_OTHER)
    figure = f"{kv['added_p50_ms']:.2f} / {kv['added_p99_ms']:.2f} ms; {kv['req_per_s']:,.0f} req/s"
    if other:
        figure += (
            f" (vllm-router {other['added_p50_ms']:.2f} / {other['added_p99_ms']:.2f} ms; "
            f"{other['req_per_s']:,.0f} req/s)"
        )
    return [("router added latency p50 / p99 at 500 req/s; max throughput", figure, r.command)]
