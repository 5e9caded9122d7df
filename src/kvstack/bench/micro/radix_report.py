"""The published table of ``kvstack bench radix``, rendered from its committed result.

:func:`markdown` turns one result (the dict the benchmark saves) into the table it prints;
:func:`render` adds the line naming the run. The published latency is the wall clock; the CPU
time of the same calls is beside it, p50 and p99 of both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import stale_line, table, target
from kvstack.bench.results import newest

__all__ = ["BAR_US", "headline", "markdown", "render"]

BAR_US = 1000.0  # the bar: match + insert well under a millisecond (wall-clock p50)

_OPS = (
    ("match", "match (every owner's prefix)"),
    ("insert", "insert (one owner)"),
    ("match_insert", "**match + insert**"),
    ("copy_reference", "reference: `list(tokens)`"),
)


def _us(x: float) -> str:
    return f"{x:,.0f}"


def _ms(us: float) -> str:
    return f"{us / 1000:.3g}"


def _met(result: dict[str, Any]) -> bool:
    return bool(result["match_insert"]["wall"]["p50_us"] < result.get("bar_us", BAR_US))


def markdown(result: dict[str, Any]) -> str:
    """The operations' table of one result."""
    copy = result["copy_reference"]["wall"]["p50_us"]
    bar = result.get("bar_us", BAR_US)
    rows = []
    for key, name in _OPS:
        wall, cpu = result[key]["wall"], result[key]["cpu"]
        cell = ""
        if key == "match_insert":
            cell = target(_met(result), f"wall p50 < {bar / 1000:g} ms")
        rows.append(
            (name, _us(wall["p50_us"]), _us(wall["p99_us"]), _us(cpu["p50_us"]),
             _us(cpu["p99_us"]), f"{wall['p50_us'] / copy:.1f}×", cell)
        )  # fmt: skip
    load = result.get("load_average") or {}
    headers = ("operation", "wall p50 µs", "wall p99 µs", "CPU p50 µs", "CPU p99 µs",
               "wall p50 vs copy", "target")  # fmt: skip
    both = result["match_insert"]
    return "\n".join(
        [
            f"Tree of {result['tree_tokens']:,} tokens in {result['tree_nodes']:,} nodes (built "
            f"in {result['build_s']:.1f} s); {result['prompt_tokens']:,}-token queries, "
            f"{result['matched_tokens']:,} tokens matched on average; {result['rounds']} fresh "
            "queries per operation, each call timed by the wall clock and by its thread's CPU "
            f"time (load average {load.get('before', 0):.2f} before, "
            f"{load.get('after', 0):.2f} after).",
            "",
            table(headers, rows, "lrrrrrl"),
            "",
            f"Match + insert: wall clock p50 {_ms(both['wall']['p50_us'])} ms, p99 "
            f"{_ms(both['wall']['p99_us'])} ms; CPU time p50 {_ms(both['cpu']['p50_us'])} ms, "
            f"p99 {_ms(both['cpu']['p99_us'])} ms. "
            "Where the wall clock's p99 is far above the CPU time's, the call waited for a core.",
        ]
    )


def render(results: Path) -> str:
    r = newest(results, "radix")
    if r is None:
        return "_No committed result of `kvstack bench radix` yet._"
    return stale_line(r) + "\n\n" + markdown(r.result)


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "radix")
    if r is None:
        return []
    both = r.result["match_insert"]
    wall, cpu = both["wall"], both["cpu"]
    figure = (
        f"wall p50 {_ms(wall['p50_us'])} ms, p99 {_ms(wall['p99_us'])} ms "
        f"(CPU time {_ms(cpu['p50_us'])} / {_ms(cpu['p99_us'])} ms)"
    )
    return [("radix index match + insert, 32K-token prompt on a 1M-token tree", figure, r.command)]
