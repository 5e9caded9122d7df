"""The published tables of ``kvstack bench kv``, rendered from its committed result.

:func:`markdown` turns one result (the dict the benchmark saves) into the tables the benchmark
also prints; :func:`render` adds the line naming the run, for ``docs/benchmarks.md``. Each ratio
is the median over rounds of the tier's figure over the reference measured in the same round,
with the range over rounds in brackets; the references' own GB/s are in the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import stale_line, table, target
from kvstack.bench.results import newest

__all__ = ["headline", "markdown", "render"]

SECRET_TIERS = ("cpu", "cpu+mac", "cpu+verify", "file", "file+mac")
_SECRET_NAMES = {
    "cpu": "cpu, no secret",
    "cpu+mac": "cpu, with the secret (`cpu+mac`)",
    "cpu+verify": "a CPU tier that checked a MAC on every hit (`cpu+verify`, not kvstack)",
    "file": "file, no secret",
    "file+mac": "file, with the secret (`file+mac`: sealed on write, checked on read)",
}
_REF_ROWS = (  # (row, store reference, retrieve reference)
    ("memcpy (reference: torch `copy_`)", "memcpy", "memcpy"),
    ("raw write / read (reference)", "raw write", "raw read"),
    ("raw write + fsync (reference)", "raw write+fsync", None),
)


def _gbps(x: float) -> str:
    return f"{x:.2f}"


def _spread(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _ratio(t: dict[str, Any], op: str) -> str:
    s = t[f"{op}_ratio_spread"]
    return f"{s['median']:.2f}× {t[f'{op}_ref']} ({s['min']:.2f}–{s['max']:.2f})"


def _targets(bars: dict[str, Any], tier: str) -> str:
    cells = []
    for op in ("store", "retrieve"):
        bar = bars.get(f"{tier} {op}")
        if bar is not None:
            cells.append(target(bar["ratio"] >= bar["bar"], f"{op} ≥ {bar['bar']:g}×"))
    return "; ".join(cells)


def _shape_rows(name: str, shape: dict[str, Any], bars: dict[str, Any]) -> list[list[str]]:
    mib = shape["chunk_bytes"] / 2**20
    rows: list[list[str]] = []
    refs = shape["references"]
    for row, store, retrieve in _REF_ROWS:
        if store in refs:
            back = _spread(refs[retrieve]) if retrieve else ""
            rows.append(["", row, _spread(refs[store]), "", back, "", ""])
    for tier, t in shape["tiers"].items():
        if tier in ("cpu+mac", "cpu+verify", "file+mac"):
            continue  # the secret's table
        compression = f" (stored {t['compression_ratio']:.2f}× smaller)"
        rows.append(
            [
                "",
                tier + (compression if t["compression_ratio"] > 1.01 else ""),
                _gbps(t["store_gbps"]),
                _ratio(t, "store"),
                _gbps(t["retrieve_gbps"]),
                _ratio(t, "retrieve"),
                _targets(bars, tier),
            ]
        )
    rows[0][0] = f"{name}, {mib:g} MiB chunks × {shape['num_chunks']}"
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The tiers' table, the lookup line and the cluster secret's table of one result."""
    s, bars = result["settings"], result["bars"]
    rows = [
        row
        for i, (name, shape) in enumerate(result["shapes"].items())
        for row in _shape_rows(name, shape, bars if i == 0 else {})
    ]
    headers = ("shape", "tier", "store GB/s", "store × ref (range)", "retrieve GB/s",
               "retrieve × ref (range)", "target")  # fmt: skip
    lookup, bar = result["lookup"], bars["lookup 128K"]
    lookup_target = target(bar["ms"] < bar["bar_ms"], f"< {bar['bar_ms']:g} ms")
    return "\n".join(
        [
            f"Median of {s['rounds']} rounds, {s['clock']} clock, {s['threads']} torch "
            f"thread(s), file tiers on {s['filesystem']}; a ratio is the median over rounds of "
            "the tier's GB/s over the reference's GB/s in the same round (range over rounds in "
            "brackets). References are medians over rounds (range).",
            "",
            table(headers, rows, "llrlrll"),
            "",
            f"Lookup of a 128K-token prompt (512 chunks, all stored): {lookup['hit_list_ms']:.2f} "
            f"ms, median of the lookups ({lookup_target}); "
            f"from a numpy array {lookup['hit_numpy_ms']:.2f} ms, file tier only "
            f"{lookup['hit_file_tier_only_ms']:.2f} ms, a miss {lookup['miss_ms']:.3f} ms.",
            "",
            _secret(result),
        ]
    )


def _secret(result: dict[str, Any]) -> str:
    name, shape = next(iter(result["shapes"].items()))
    tiers, bars = shape["tiers"], result["bars"]
    rows = [
        (_SECRET_NAMES[t], _ratio(tiers[t], "store"), _ratio(tiers[t], "retrieve"),
         _targets(bars, t))
        for t in SECRET_TIERS
        if t in tiers
    ]  # fmt: skip
    file, sealed = tiers["file"], tiers.get("file+mac")
    after = ""
    if sealed:
        after = (
            f"\n\nWith the secret the file tier reads at {sealed['retrieve_ratio']:.2f}× a raw "
            f"`readinto` from the page cache, against {file['retrieve_ratio']:.2f}× without it."
        )
    return (
        f"**With the cluster secret** (the same run has it on and off; {name} shape):\n\n"
        + table(("tier", "store × ref (range)", "retrieve × ref (range)", "target"), rows, "lrrl")
        + after
    )


def render(results: Path) -> str:
    r = newest(results, "kv")
    if r is None:
        return "_No committed result of `kvstack bench kv` yet._"
    return stale_line(r) + "\n\n" + markdown(r.result)


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "kv")
    if r is None:
        return []
    cpu = r.result["tiers"]["cpu"]
    memcpy = r.result["shapes"][next(iter(r.result["shapes"]))]["references"]["memcpy"]
    figure = (
        f"{cpu['store_ratio']:.2f}× / {cpu['retrieve_ratio']:.2f}× "
        f"(memcpy {memcpy['median']:.2f} GB/s)"
    )
    return [("CPU tier store / retrieve vs memcpy (32 MiB chunks)", figure, r.command)]
