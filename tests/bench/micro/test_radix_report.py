"""The published table of ``kvstack bench radix`` from a synthetic result: wall clock and CPU
time, p50 and p99 of both, the target judged on the wall clock's p50."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvstack.bench.micro import radix_report
from kvstack.bench.micro.radix_measure import OpTiming, RadixBenchResult, Timing
from tests.bench.micro.conftest import SaveResult


def op(wall_p50: float, wall_p99: float, cpu_p50: float, cpu_p99: float) -> OpTiming:
    return OpTiming(Timing(wall_p50, wall_p99, wall_p50), Timing(cpu_p50, cpu_p99, cpu_p50))


def radix_result(match_insert: OpTiming) -> dict[str, Any]:
    result = RadixBenchResult(
        tree_tokens=1_006_672, tree_nodes=4_000, build_s=12.5, prompt_tokens=32_768,
        matched_tokens=24_000, rounds=300, match=op(444, 900, 430, 600),
        insert=op(204, 700, 200, 500), match_insert=match_insert,
        copy_reference=op(100, 150, 100, 140),
    )  # fmt: skip
    document = dataclasses.asdict(result)
    document["load_average"] = {"before": 0.5, "after": 0.7}
    return document


def test_wall_clock_and_cpu_time_side_by_side(save_result: SaveResult) -> None:
    text = radix_report.render(save_result("radix", radix_result(op(745, 7_300, 700, 1_200))))
    row = "| **match + insert** | 745 | 7,300 | 700 | 1,200 | 7.5× | wall p50 < 1 ms: met |"
    assert row in text
    assert "wall clock p50 0.745 ms, p99 7.3 ms; CPU time p50 0.7 ms, p99 1.2 ms" in text
    assert "1,006,672 tokens" in text and "`kvstack bench radix --synthetic`" in text


def test_a_missed_target_says_missed(save_result: SaveResult) -> None:
    # The CPU time meets the bar; the wall clock, which is judged, does not.
    text = radix_report.render(save_result("radix", radix_result(op(1_200, 9_000, 800, 950))))
    line = next(x for x in text.splitlines() if x.startswith("| **match + insert**"))
    assert line.endswith("wall p50 < 1 ms: **missed** |")


def test_headline_is_the_wall_clock(save_result: SaveResult) -> None:
    results = save_result("radix", radix_result(op(745, 7_300, 700, 1_200)))
    ((what, figure, command),) = radix_report.headline(results)
    assert "match + insert" in what and command == "kvstack bench radix --synthetic"
    assert figure == "wall p50 0.745 ms, p99 7.3 ms (CPU time 0.7 / 1.2 ms)"
