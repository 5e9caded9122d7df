"""The published tables of ``kvstack bench sim`` from a synthetic result: one engine against
the canned upstream, the fleet's rates, and targets that say met or missed."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kvstack.bench.micro import sim_report
from kvstack.bench.micro.sim_perf import FleetPoint, SinglePoint, _parser
from tests.bench.micro.conftest import SaveResult


def point(rate: float, lag: float, fits: bool) -> FleetPoint:
    return FleetPoint(
        rate=rate, requests=int(rate * 60), errors=0, client_ttft_mean_s=0.170,
        engine_ttft_mean_s=0.100, ttft_ratio=1.7, lag_share=lag,
        cpu_share={"fleet": 0.4, "router": 0.2, "loadgen": 0.2},
        cpu_ms_per_request={"fleet": 2.5, "router": 1.2, "loadgen": 1.1},
        projected_wall_rps=400.0, fits=fits,
    )  # fmt: skip


def sim_result(engine_rps: float) -> dict[str, Any]:
    single = [SinglePoint("sim-engine", 16, engine_rps, 0.00043),
              SinglePoint("sim-engine", 4, engine_rps * 1.25, 0.00055),
              SinglePoint("canned upstream", 4, 4000.0, 0.0001)]  # fmt: skip
    fleet = [point(2, 0.016, True), point(16, 0.082, False)]
    return {
        "args": vars(_parser().parse_args([])),
        "cpus": 2,
        "single": [asdict(p) for p in single],
        "single_load": {"load_average": 0.6, "cpu_pressure": "1.2%"},
        "fleet": [asdict(p) for p in fleet],
        "fleet_load": {"load_average": 0.9, "cpu_pressure": "3.0%"},
        "highest_fitting_rate": 2.0,
    }


def test_engine_and_fleet_tables(save_result: SaveResult) -> None:
    text = sim_report.render(save_result("sim", sim_result(1819.0)))
    assert "| sim-engine | 16 | 1,819 | 0.43 | 0.45× | ≥ 500 req/s: met |" in text
    assert "| canned upstream (reference) | 4 | 4,000 | 0.10 | 1.00× |  |" in text
    assert "| 2 | 20 | 120 | 0 | 0.170 | 0.100 | +7.0 | 1.6% |" in text
    assert "16 engines in one process at time scale 10" in text
    assert "Highest simulated rate that fits: 2 req/s." in text


def test_a_missed_target_says_missed(save_result: SaveResult) -> None:
    text = sim_report.render(save_result("sim", sim_result(400.0)))
    engine = next(x for x in text.splitlines() if x.startswith("| sim-engine | 16 |"))
    assert engine.endswith("≥ 500 req/s: **missed** |")
    rate16 = next(x for x in text.splitlines() if x.startswith("| 16 | 160 |"))
    assert rate16.endswith("lag < 5%, CPUs < 90%, no errors: **missed** |")
    rate2 = next(x for x in text.splitlines() if x.startswith("| 2 | 20 |"))
    assert rate2.endswith("no errors: met |")


def test_no_headline_row() -> None:
    from pathlib import Path

    assert sim_report.headline(Path("unused")) == []
