"""The published tables of ``kvstack bench epp``, rendered from its committed result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import num, stale_line, table, target
from kvstack.bench.results import newest

__all__ = ["headline", "render"]

BAR_P99_MS = 2.0  # the bar: added decision p99 at 500 decisions/s


def _m(cell: dict[str, Any]) -> str:
    return f"{num(cell['median'])} ({num(cell['min'])}–{num(cell['max'])})"


def render(results: Path) -> str:
    r = newest(results, "epp")
    if r is None:
        return "_No committed result of `kvstack bench epp` yet._"
    lat, rows = r.result["latency"], []
    for rate in sorted(lat["kvstack"], key=float):
        for arm in ("kvstack", "null"):
            c = lat[arm][rate]
            bar = ""
            if arm == "kvstack" and float(rate) == 500:
                bar = target(
                    c["decision_p99_ms"]["median"] <= BAR_P99_MS, f"p99 ≤ {BAR_P99_MS:g} ms"
                )
            rows.append(
                (
                    f"{float(rate):g}",
                    arm,
                    _m(c["achieved_rps"]),
                    _m(c["decision_p50_ms"]),
                    _m(c["decision_p99_ms"]),
                    f"{c['errors']['median']:g}",
                    f"{c['cpu_ms_per_request']['median']:.2f}",
                    bar,
                )
            )
    out = [
        stale_line(r),
        "",
        table(
            (
                "offered/s",
                "ext_proc server",
                "achieved/s",
                "decision p50 ms",
                "decision p99 ms",
                "errors",
                "CPU ms/decision",
                "target",
            ),
            rows,
            "rlrrrrrl",
        ),
    ]
    thr = r.result.get("throughput")
    if thr:
        k, n = thr["kvstack"]["decisions_per_s"], thr["null"]["decisions_per_s"]
        out += [
            "",
            f"Closed loop: kvstack {k['median']:.0f} decisions/s against the null "
            f"server's {n['median']:.0f} ({k['median'] / n['median']:.2f}×).",
        ]
    kinds = r.result.get("error_kinds", {}).get("kvstack")
    if kinds:
        out += [
            "",
            "Errors of the kvstack arm by kind: "
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
            + ".",
        ]
    return "\n".join(out)


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "epp")
    if r is None:
        return []
    lat = r.result["latency"]
    top = max(lat["kvstack"], key=float)
    k, n = lat["kvstack"][top], lat["null"][top]
    p99 = k["decision_p99_ms"]["median"]
    return [
        (
            f"endpoint picker at {float(top):g} decisions/s offered: decision p99",
            f"{num(k['decision_p99_ms']['median'])} ms at {num(k['achieved_rps']['median'])}/s "
            f"achieved (a null ext_proc server {num(n['decision_p99_ms']['median'])} ms; "
            f"{target(p99 <= BAR_P99_MS, f'target ≤ {BAR_P99_MS:g} ms')})",
            f"`{r.command}`",
        )
    ]
