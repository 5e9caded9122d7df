"""`kvstack bench router` runs end to end (tiny settings) and reports every figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvstack.bench.micro.router import run
from kvstack.bench.micro.router_harness import _parse_wrk
from kvstack.bench.micro.router_loadgen import LoadResult

pytestmark = pytest.mark.slow


def test_bench_router_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "router.json"
    argv = ["--rounds", "1", "--round-s", "1", "--rate", "100", "--connections", "4"]
    assert run([*argv, "--no-vllm-router", "--json", str(out)]) == 0
    document = json.loads(out.read_text())["result"]
    assert len(document["runs"]) == 1 and set(document["median"]) == {"kvstack"}
    report = document["runs"][0]
    kv = report["routers"]["kvstack"]
    assert kv["latency"]["p50_ms"] > 0 and kv["throughput"]["req_per_s"] > 0
    assert kv["throughput"]["errors"] == 0
    assert report["kvstack_internal_added"]["count"] > 0
    assert set(report["bars"]) == {"added_p50_ms<=1", "added_p99_ms<=5", "req_per_s>=2000"}
    printed = capsys.readouterr().out
    assert "kvstack" in printed and "| **median** |" in printed and "vllm-router" in printed


def test_wrk_output_parsing_and_percentiles() -> None:
    text = """Running 5s test @ http://127.0.0.1:1/v1/completions
  Latency Distribution
     50%  812.00us
     99%    4.21ms
  12000 requests in 5.00s, 3.2MB read
  Non-2xx or 3xx responses: 3
Requests/sec:   2400.50
"""
    result = _parse_wrk(text)
    assert (result.req_per_s, result.errors) == (2400.5, 3)
    assert result.p50_ms == pytest.approx(0.812) and result.p99_ms == pytest.approx(4.21)
    # The load generator's percentiles are bench.load.stats.percentile's (linear interpolation).
    four = LoadResult("closed", 1.0, latencies_ms=[4.0, 1.0, 3.0, 2.0])
    assert four.latency_ms(50) == 2.5 and four.summary()["p99_ms"] == pytest.approx(3.97)
    assert LoadResult("closed", 1.0, latencies_ms=[5.0]).latency_ms(99) == 5.0
    assert math.isnan(LoadResult("closed", 1.0).summary()["p50_ms"])
