"""The published table of ``kvstack bench router`` from synthetic runs: both routers' added
latency and throughput per run and the median over runs, targets judged in every row."""

from __future__ import annotations

from typing import Any

from kvstack.bench.micro import router, router_report
from tests.bench.micro.conftest import SaveResult

NAMES = ("direct", "kvstack", "vllm-router")


def one_run(kv_p99: float, kv_rps: float, vr_rps: float) -> dict[str, Any]:
    """A run of two rounds with the given kvstack p99 (added: minus the direct 1 ms)."""
    p99 = {"direct": 1.0, "kvstack": 1.0 + kv_p99, "vllm-router": 2.0}
    p50 = {"direct": 0.5, "kvstack": 1.0, "vllm-router": 0.9}
    rounds = [{n: {"p50_ms": p50[n], "p90_ms": p99[n], "p99_ms": p99[n], "max_lag_ms": 0.1}
               for n in NAMES} for _ in range(2)]  # fmt: skip
    rps = {"direct": 20000.0, "kvstack": kv_rps, "vllm-router": vr_rps}
    throughput = {
        n: {"req_per_s": rps[n], "rounds_req_per_s": [rps[n]], "errors": 0, "tool": "wrk",
            "cpu_us_per_req": {"upstream": 30.0, n: 160.0 if n == "kvstack" else 85.0}}
        for n in NAMES
    }  # fmt: skip
    internal = {"p50_le_ms": 0.25, "p99_le_ms": 0.5, "count": 3000.0}
    report = router._report(rounds, throughput, internal)
    report["load_average"] = {"before": 0.6, "after": 1.2}
    return report


def document(runs: list[dict[str, Any]]) -> dict[str, Any]:
    settings = vars(router._parser().parse_args(["--runs", str(len(runs))]))
    return {"settings": settings, "runs": runs, "median": router._median_over_runs(runs)}


def test_both_routers_per_run_and_the_median(save_result: SaveResult) -> None:
    runs = [one_run(2.07, 6431, 15141), one_run(2.67, 5475, 13451), one_run(0.105, 5900, 15017)]
    text = router_report.render(save_result("router", document(runs)))
    assert "| 1 | 0.500 / 2.070 | 6,431 | 0.400 / 1.000 | 15,141 | 0.6–1.2 |" in text
    assert "| **median** | **0.500 / 2.070** | **5,900** | 0.400 / 1.000 | 15,017 |" in text
    assert text.count("p50 ≤ 1 ms: met; p99 ≤ 5 ms: met; ≥ 2,000 req/s: met") == 4
    assert "throughput 0.39×" in text and "160 µs against 85 µs" in text
    assert "3 runs, each with fresh processes" in text and "(wrk)" in text


def test_a_missed_target_says_missed(save_result: SaveResult) -> None:
    runs = [one_run(24.9, 4725, 15000), one_run(1.1, 1800, 15000), one_run(3.0, 5000, 15000)]
    text = router_report.render(save_result("router", document(runs)))
    first, second = (x for x in text.splitlines() if x.startswith(("| 1 |", "| 2 |")))
    assert "p99 ≤ 5 ms: **missed**" in first and "≥ 2,000 req/s: met" in first
    assert "p99 ≤ 5 ms: met" in second and "≥ 2,000 req/s: **missed**" in second
    median = next(x for x in text.splitlines() if x.startswith("| **median**"))
    assert "p99 ≤ 5 ms: met" in median and "≥ 2,000 req/s: met" in median  # 3.0 ms, 4,725/s


def test_without_vllm_router(save_result: SaveResult) -> None:
    run = one_run(1.0, 5000, 1.0)
    del run["routers"]["vllm-router"]
    text = router_report.render(save_result("router", document([run])))
    assert "| 1 | 0.500 / 1.000 | 5,000 | not run | not run |" in text
    assert "Against vllm-router" not in text


def test_headline_gives_both_routers(save_result: SaveResult) -> None:
    runs = [one_run(2.07, 6431, 15141), one_run(0.105, 5900, 15017)]
    ((_, figure, command),) = router_report.headline(save_result("router", document(runs)))
    assert figure == "0.50 / 1.09 ms; 6,166 req/s (vllm-router 0.40 / 1.00 ms; 15,079 req/s)"
    assert command == "kvstack bench router --synthetic"
