"""``kvstack bench sim`` runs end to end (tiny sizes; the figures themselves are not judged)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_sim_single_and_fleet(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvstack", "bench", "sim", "--single-duration", "1",
         "--concurrency", "4", "--engines", "2", "--rates", "2", "--duration", "10",
         "--groups", "2", "--prefix-tokens", "200", "--output-tokens", "8",
         "--router", "rr-proxy", "--workdir", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())["result"]
    targets = {(p["target"], p["output_tokens"]) for p in doc["single"]}
    assert targets == {("sim-engine", 16), ("sim-engine", 4), ("canned upstream", 4)}
    assert all(p["requests_per_s"] > 0 for p in doc["single"])
    (point,) = doc["fleet"]
    assert point["requests"] > 5 and point["errors"] == 0
    assert set(point["cpu_share"]) == {"fleet", "router", "loadgen"}
    assert point["engine_ttft_mean_s"] > 0 and point["client_ttft_mean_s"] > 0
    assert "highest simulated rate that fits" in done.stdout
    assert doc["args"]["engines"] == 2 and doc["highest_fitting_rate"] in (None, 2.0)
