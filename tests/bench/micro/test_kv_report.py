"""The published tables of ``kvstack bench kv`` from a synthetic result: per-round ratios with
their range, the references' GB/s, and a missed target flagged as missed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvstack.bench.micro import kv, kv_report
from kvstack.bench.micro.kv_figures import summarise
from kvstack.bench.results import newest
from tests.bench.micro.conftest import SaveResult

CHUNK_BYTES = 32 << 20
NUM_CHUNKS = 8
ROUNDS = 2
# Two rounds whose load differs twofold: a ratio is taken per round, then the median.
SAMPLES = {
    "memcpy": [2.0, 1.0],
    "cpu.store": [1.8, 0.7],  # ratios 0.9 and 0.7: median 0.8, the bar itself (met)
    "cpu.retrieve": [2.2, 1.1],
    "cpu+mac.store": [1.8, 0.8],
    "cpu+mac.retrieve": [2.2, 1.0],
    "cpu+verify.store": [1.0, 0.5],
    "cpu+verify.retrieve": [1.0, 0.5],
}
FILE_FIGURES = {  # variant: (raw write, store, raw read, retrieve), both rounds alike
    "file": (1.0, 0.8, 3.0, 2.4),
    "file+fsync": (0.3, 0.28, 3.0, 1.71),  # retrieve 0.57× raw read: misses the 0.7× bar
    "file+zstd": (1.0, 0.2, 3.0, 0.3),
    "file+lz4": (1.0, 0.3, 3.0, 0.5),
    "file+mac": (1.0, 0.5, 3.0, 1.05),
}


def kv_result() -> dict[str, Any]:
    samples = {k: list(v) for k, v in SAMPLES.items()}
    for name, figures in FILE_FIGURES.items():
        parts = ("ref.write", "store", "ref.read", "retrieve")
        samples |= {f"{name}.{part}": [x] * ROUNDS for part, x in zip(parts, figures, strict=True)}
    fsync = {v.name: v.fsync for v in kv.VARIANTS}
    raw = NUM_CHUNKS * CHUNK_BYTES * ROUNDS
    bytes_read = {name: raw // 2 if name == "file+zstd" else raw for name in fsync}
    shapes = [
        summarise(shape, CHUNK_BYTES, NUM_CHUNKS, fsync, bytes_read, samples)
        for shape in ("llama-3-8b", "toy-150m")
    ]
    lookup = {"hit_list_ms": 1.95, "hit_numpy_ms": 1.2, "hit_file_tier_only_ms": 2.5,
              "miss_ms": 0.01}  # fmt: skip
    settings = {"rounds": ROUNDS, "clock": "wall", "threads": 2, "filesystem": "ext4"}
    return kv.build_report(shapes, lookup, settings)


def row(text: str, tier: str) -> str:
    """The first row of ``tier`` in the tiers' table (the main shape's)."""
    pattern = re.compile(rf"\|[^|]*\| {re.escape(tier)} ")
    return next(line for line in text.splitlines() if pattern.match(line))


def rows_of(text: str, tier: str) -> list[str]:
    """Every row where ``tier``'s target is judged: the tiers' table and the secret's."""
    secret = [f"| {kv_report._SECRET_NAMES[tier]} |"] if tier in kv_report.SECRET_TIERS else []
    found = [line for line in text.splitlines() if any(line.startswith(s) for s in secret)]
    if tier not in ("cpu+mac", "cpu+verify", "file+mac"):
        found.append(row(text, tier))
    return found


def test_ratios_are_per_round_with_their_range(save_result: SaveResult) -> None:
    result = kv_result()
    cpu = result["tiers"]["cpu"]
    # Per round: 1.8/2.0 and 0.7/1.0; the ratio of the medians (1.25/1.5) would be 0.83.
    assert cpu["store_ratio"] == 0.8
    assert (cpu["store_ratio_spread"]["min"], cpu["store_ratio_spread"]["max"]) == (0.7, 0.9)
    text = kv_report.render(save_result("kv", result))
    assert "`kvstack bench kv --synthetic`" in text and "`abc1234`" in text
    assert "| memcpy (reference: torch `copy_`) | 1.50 (1.00–2.00) |" in text
    assert "| 1.25 | 0.80× memcpy (0.70–0.90) |" in row(text, "cpu")
    assert "store ≥ 0.8×: met" in row(text, "cpu")
    assert "file+zstd (stored 2.00× smaller)" in text
    assert "1.95 ms, median of the lookups (< 5 ms: met)" in text
    assert "| cpu, with the secret (`cpu+mac`) | 0.85× memcpy (0.80–0.90) |" in text


def test_a_missed_target_says_missed(save_result: SaveResult) -> None:
    text = kv_report.render(save_result("kv", kv_result()))
    fsync = row(text, "file+fsync")
    assert "0.57× raw read (0.57–0.57)" in fsync
    assert "retrieve ≥ 0.7×: **missed**" in fsync and "retrieve ≥ 0.7×: met" not in fsync
    assert "store ≥ 0.7×: met" in fsync  # 0.93× raw write+fsync


def test_every_target_cell_matches_its_figure(save_result: SaveResult) -> None:
    result = kv_result()
    text = kv_report.render(save_result("kv", result))
    for name, bar in result["bars"].items():
        if "ratio" not in bar:
            continue
        tier, op = name.rsplit(" ", 1)
        verdict = "met" if bar["ratio"] >= bar["bar"] else "**missed**"
        cells = rows_of(text, tier)
        assert cells and all(f"{op} ≥ {bar['bar']:g}×: {verdict}" in c for c in cells), name


def test_variant_files_are_not_the_plain_run(save_result: SaveResult) -> None:
    results = save_result("kv", kv_result())
    device = results / "kv" / "kv-device-2026-12-02.json"
    device.write_text(
        (results / "kv" / "kv-2026-12-01.json").read_text().replace("2026-12-01T", "2026-12-02T")
    )
    picked = newest(results, "kv")
    assert picked is not None and picked.path.name == "kv-2026-12-01.json"


def test_headline_gives_the_cpu_tier_against_memcpy(save_result: SaveResult) -> None:
    ((what, figure, command),) = kv_report.headline(save_result("kv", kv_result()))
    assert "CPU tier" in what and command == "kvstack bench kv --synthetic"
    assert figure == "0.80× / 1.10× (memcpy 1.50 GB/s)"


def test_no_result_yet(tmp_path: Path) -> None:
    assert "No committed result" in kv_report.render(tmp_path)
    assert kv_report.headline(tmp_path) == []
