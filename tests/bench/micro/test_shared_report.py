"""The published table of ``kvstack bench shared`` from a synthetic result: medians with the
range over rounds, ratios per round against that round's loopback TCP, targets flagged."""

from __future__ import annotations

from typing import Any

from kvstack.bench.micro import shared_report
from kvstack.bench.micro.shared_tiers import shared_figures
from tests.bench.micro.conftest import SaveResult


def shared_result(tuned: list[float]) -> dict[str, Any]:
    per_round = {
        "tcp": [2.0, 1.0, 1.5],
        "redis": [0.9, 0.5, 0.8],
        "redis_tuned": tuned,
        "redis_py": [0.4, 0.2, 0.3],
        "peer": [1.6, 0.6, 1.2],  # per round 0.8, 0.6, 0.8× TCP
    }
    result = shared_figures(per_round, store_gbps=1.08, num_chunks=8)
    result["s3"] = {"get_gbps": 0.29, "store_gbps": 0.06}
    return result


def test_medians_ranges_and_per_round_ratios(save_result: SaveResult) -> None:
    text = shared_report.render(save_result("shared", shared_result([1.4, 1.1, 1.3])))
    assert "| loopback TCP, one connection (reference) | 1.50 (1.00–2.00) | 1× |  |" in text
    assert "| peer fetch | 1.20 (0.60–1.60) | 0.80× (0.60–0.80) | ≥ 0.5× TCP: met |" in text
    tuned = next(x for x in text.splitlines() if "tuned server" in x)
    assert "1.30 (1.10–1.40)" in tuned and tuned.endswith("≥ 1.0 GB/s: met |")
    assert "| redis store (put + flush), stock server, one call | 1.08 |" in text
    assert "0.29 / 0.06" in text and "median of 3 interleaved rounds" in text


def test_a_missed_target_says_missed(save_result: SaveResult) -> None:
    text = shared_report.render(save_result("shared", shared_result([1.2, 0.6, 0.9])))
    tuned = next(x for x in text.splitlines() if "tuned server" in x)
    assert tuned.endswith("≥ 1.0 GB/s: **missed** |")
    stock = next(x for x in text.splitlines() if "stock server |" in x and "batched" in x)
    assert stock.endswith("(not kvstack's server): **missed** |")


def test_headline(save_result: SaveResult) -> None:
    results = save_result("shared", shared_result([1.4, 1.1, 1.3]))
    ((_, figure, command),) = shared_report.headline(results)
    assert figure == "1.30 GB/s (stock server 0.80) / 0.80× loopback TCP"
    assert command == "kvstack bench shared --synthetic"
