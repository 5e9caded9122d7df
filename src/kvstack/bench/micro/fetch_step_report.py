"""The published table of ``kvstack bench fetch``, rendered from its committed result.

:func:`markdown` turns one result (the dict the benchmark saves) into the table it prints;
:func:`render` adds the line naming the run. Each figure is the median over rounds with the
range over rounds in brackets; a step p99 ratio is taken against the step alone (``none``) in
the same round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import stale_line, table
from kvstack.bench.results import newest

__all__ = ["headline", "markdown", "render"]

_ARM_NAMES = {
    "none": "the step alone",
    "thread-4": "loader thread, `readers=4`",
    "thread-1": "loader thread, `readers=1`",
    "thread": "loader thread",
    "process": "helper process, shared memory",
}


def _spread(s: dict[str, float], unit: str = "") -> str:
    return f"{s['median']:.3g}{unit} ({s['min']:.3g}–{s['max']:.3g})"


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for load in result["loads"]:
        for arm, row in load["arms"].items():
            fetch = row.get("fetch_seen_ms")
            own = row.get("fetch_own_ms")
            rows.append(
                (
                    f"{load['python_ms']:g} ms" if arm == "none" else "",
                    _ARM_NAMES.get(arm, arm),
                    _spread(row["step_p50_ms"]),
                    _spread(row["step_p99_ms"]),
                    "" if arm == "none" else _spread(row["step_p99_ratio"], "×"),
                    _spread(fetch) if fetch else "",
                    _spread(own) if own else "",
                    row.get("fetches", ""),
                )
            )
    cpus = result.get("cpus") or {}
    mib = result["chunk_bytes"] / 2**20
    source = "from the page cache"
    if result.get("tier") == "redis":
        source = "from a redis-server on loopback (on the fetches' CPUs)"
    elif result.get("cold"):
        source = "from disk (dropped from the page cache before each fetch)"
    headers = ("step's Python", "fetch on", "step p50 ms", "step p99 ms", "p99 × alone",
               "fetch ms (seen by the step)", "fetch ms (own)", "fetches")  # fmt: skip
    return "\n".join(
        [
            f"Fetches of {result['chunks']} chunks of {mib:g} MiB {source} beside a "
            f"step of that much interpreter work plus {result['compute_ms']:g} ms of torch; "
            f"{result['rounds']} rounds of {result['seconds']:g} s per arm, the arms in rotating "
            f"order; step on CPU {cpus.get('step')}, fetches on CPUs {cpus.get('fetch')}; "
            f"switch interval {result['switch_interval_ms']:g} ms. Medians over rounds "
            "(range).",
            "",
            table(headers, rows, "llrrrrrr"),
        ]
    )


def render(results: Path) -> str:
    parts = []
    for variant in (None, "cold", "redis", "si05"):  # si05: a 0.5 ms switch interval
        r = newest(results, "fetch", variant)
        if r is not None:
            parts.append(stale_line(r) + "\n\n" + markdown(r.result))
    return "\n\n".join(parts) or "_No committed result of `kvstack bench fetch` yet._"


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "fetch")
    if r is None:
        return []
    load = max(r.result["loads"], key=lambda x: x["python_ms"])
    arms = load["arms"]
    figure = (
        f"{arms['thread-4']['fetch_seen_ms']['median']:.3g} ms on a loader thread (the "
        f"connector's default), {arms['process']['fetch_seen_ms']['median']:.3g} ms in a "
        "helper process (opt-in `load_fetch: process`)"
    )
    what = (
        f"a {r.result['chunks']}-chunk fetch beside a step with {load['python_ms']:g} ms of Python"
    )
    return [(what, figure, r.command)]
