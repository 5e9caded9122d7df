"""The published table of ``kvstack bench shared``, rendered from its committed result.

:func:`markdown` turns one result (the dict the benchmark saves, also what ``kvstack bench kv
--shared`` adds under ``"shared"``) into the table the benchmark prints; :func:`render` adds the
line naming the run. GB/s are medians over the interleaved rounds with the range over rounds;
each ratio is per round, against that round's loopback TCP figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import stale_line, table, target
from kvstack.bench.results import newest

__all__ = ["headline", "markdown", "render"]

_ROWS = (  # (transfer, row)
    ("tcp", "loopback TCP, one connection (reference)"),
    ("redis_tuned", "**redis batched get, tuned server** (kvstack's RESP client)"),
    ("redis", "redis batched get, stock server"),
    ("redis_py", "redis-py pipelined get, stock server (reference)"),
    ("peer", "peer fetch"),
)


def _spread(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _times(s: dict[str, float]) -> str:
    return f"{s['median']:.2f}× ({s['min']:.2f}–{s['max']:.2f})"


def _target(result: dict[str, Any], name: str) -> str:
    bar_gbps = result.get("bar_redis_gbps", 1.0)
    bar_ratio = result.get("bar_peer_ratio", 0.5)
    if name == "redis_tuned":
        return target(result["spread_gbps"][name]["median"] >= bar_gbps, f"≥ {bar_gbps:.1f} GB/s")
    if name == "redis":  # the same bar, for a server started without kvstack's setting
        met = result["spread_gbps"][name]["median"] >= bar_gbps
        return target(met, f"≥ {bar_gbps:.1f} GB/s (not kvstack's server)")
    if name == "peer":
        met = result["ratio_vs_tcp"][name]["median"] >= bar_ratio
        return target(met, f"≥ {bar_ratio:g}× TCP")
    return ""


def markdown(result: dict[str, Any]) -> str:
    """The shared tiers' table of one result."""
    rows = []
    for name, row in _ROWS:
        ratio = "1×" if name == "tcp" else _times(result["ratio_vs_tcp"][name])
        rows.append((row, _spread(result["spread_gbps"][name]), ratio, _target(result, name)))
    rows.insert(
        4,
        ("redis store (put + flush), stock server, one call",
         f"{result['redis']['store_gbps']:.2f}", "", ""),
    )  # fmt: skip
    s3 = result.get("s3")
    if s3:
        rows.append(
            ("s3 (moto server, a Python mock) get / store",
             f"{s3['get_gbps']:.2f} / {s3['store_gbps']:.2f}", "", "")
        )  # fmt: skip
    mib = result["chunk_bytes"] / 2**20
    return "\n".join(
        [
            f"{result['num_chunks']} chunks × {mib:g} MiB per call, median of {result['rounds']} "
            "interleaved rounds (range over rounds); ratios per round against that round's "
            f"loopback TCP; load average {result['load_average']:.2f} when it ended.",
            "",
            table(("path", "GB/s (range)", "vs loopback TCP (range)", "target"), rows, "lrrl"),
        ]
    )


def render(results: Path) -> str:
    r = newest(results, "shared")
    if r is None:
        return "_No committed result of `kvstack bench shared` yet._"
    return stale_line(r) + "\n\n" + markdown(r.result)


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "shared")
    if r is None:
        return []
    res = r.result
    figure = (
        f"{res['spread_gbps']['redis_tuned']['median']:.2f} GB/s (stock server "
        f"{res['spread_gbps']['redis']['median']:.2f}) / "
        f"{res['ratio_vs_tcp']['peer']['median']:.2f}× loopback TCP"
    )
    return [("Redis batched get / peer fetch, 32 MiB chunks on loopback", figure, r.command)]
