"""``kvstack bench shared`` runs end to end against real servers and writes its JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_bench_shared_measures_both_redis_servers_and_the_peer(tmp_path: Path) -> None:
    out = tmp_path / "shared.json"
    argv = [sys.executable, "-m", "kvstack", "bench", "shared", "--chunks", "1", "--rounds", "1",
            "--json", str(out)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())["result"]
    redis = report["redis"]
    for name in ("get_gbps", "tuned_get_gbps", "redis_py_get_gbps", "store_gbps"):
        assert redis[name] > 0, name
    assert report["tcp_loopback_gbps"] > 0 and report["peer"]["get_gbps"] > 0
    assert set(report["bars"]) == {"redis_get_ge_1gbps", "peer_ge_half_tcp"}
    assert report["rounds_gbps"]["peer"] and report["ratio_vs_tcp"]["peer"]["median"] > 0
    assert "tuned server" in proc.stdout and "≥ 1.0 GB/s" in proc.stdout
