"""``kvstack bench kv --quick --shared`` runs end to end and saves the documented result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_bench_kv_quick_writes_the_json_shape(tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvstack",
            "bench",
            "kv",
            "--quick",
            "--json",
            str(out),
            "--dir",
            str(tmp_path),
            "--rounds",
            "1",
            "--shared",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    document = json.loads(out.read_text())
    assert document["bench"] == "kv" and document["command"].startswith("kvstack bench kv --quick")
    report = document["result"]
    for name in ("memcpy_gbps", "file_write_gbps", "file_read_gbps", "lookup_ms_128k"):
        assert isinstance(report[name], float) and report[name] > 0, name
    for tier in ("cpu", "file", "file+fsync", "file+zstd", "file+lz4"):
        figures = report["tiers"][tier]
        assert figures["store_gbps"] > 0 and figures["retrieve_gbps"] > 0, tier
        assert figures["store_ratio"] > 0 and figures["retrieve_ratio"] > 0, tier
        spread = figures["retrieve_ratio_spread"]
        assert spread["min"] <= figures["retrieve_ratio"] <= spread["max"], tier
    main = report["shapes"]["llama-3-8b"]
    assert set(main["references"]) == {"memcpy", "raw write", "raw read", "raw write+fsync"}
    assert len(main["samples"]["memcpy"]) == 1 and report["args"]["rounds"] == 1
    assert set(report["shapes"]) == {"llama-3-8b", "toy-150m"}
    assert report["shapes"]["llama-3-8b"]["chunk_bytes"] == 32 << 20
    assert all("ok" in bar for bar in report["bars"].values())
    assert (
        "memcpy (reference: torch" in proc.stdout and "Lookup of a 128K-token prompt" in proc.stdout
    )
    assert not list(tmp_path.glob("kvstack-bench-kv-*")), "the benchmark left files behind"
    shared = report["shared"]  # the shared tiers, measured by the same command
    assert shared["redis"]["tuned_get_gbps"] > 0 and shared["peer"]["get_gbps"] > 0
    assert "redis batched get" in proc.stdout and "peer fetch" in proc.stdout
    assert "With the cluster secret" in proc.stdout


def test_bench_kv_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstack.bench.micro import kv

    with pytest.raises(SystemExit) as exit_info:
        kv.run(["--rounds", "0"])
    assert exit_info.value.code == 2
    assert "must be a positive integer, got '0'" in capsys.readouterr().err
