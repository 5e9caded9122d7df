"""``kvstack bench fetch``: a real run (file tier, loader threads, a spawned helper process) at
the smallest settings, a fetch that loses a chunk failing the run, and the published table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstack.bench import results
from kvstack.bench.micro import fetch_step, fetch_step_report
from kvstack.kv.keys import KEY_BYTES, ChunkKey
from kvstack.kv.tiers.file.tier import FileTier
from tests.bench.micro.conftest import SaveResult


def _small_run(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "fetch.json"
    argv = ["--quick", "--chunks", "2", "--chunk-mib", "1", "--seconds", "0.3", "--python-ms",
            "1", "--dir", str(tmp_path), "--json", str(out), *extra]  # fmt: skip
    # Its own process: the run binds its process to one CPU while it measures.
    done = subprocess.run(
        [sys.executable, "-m", "kvstack", "bench", "fetch", *argv],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(tmp_path.glob("kvstack-bench-fetch-*")), "the run's directory was left"
    return json.loads(out.read_text())["result"], done.stdout


def _check_arms(result: dict[str, Any], arms: list[str]) -> None:
    (load,) = result["loads"]
    assert list(load["arms"]) == ["none", *arms]
    for arm in arms:
        row = load["arms"][arm]
        assert row["fetches"] >= 4, (arm, row)  # every round fetched (and got every chunk)
        assert row["fetch_seen_ms"]["median"] >= row["fetch_own_ms"]["min"] > 0
        assert row["step_p99_ratio"]["median"] > 0
    # Every fetch ran on the CPUs the run reports, and, with two or more, not on the step's.
    cpus = result["cpus"]
    assert all(on == cpus["fetch"] for on in result["ran_on"].values()), result
    if len(os.sched_getaffinity(0)) > 1:
        assert not set(cpus["fetch"]) & set(cpus["step"]), cpus


def test_a_small_run_measures_every_arm(tmp_path: Path) -> None:
    result, stdout = _small_run(tmp_path, "--cold")
    assert result["cold"] is True and result["tier"] == "file"
    _check_arms(result, ["thread-4", "thread-1", "process"])
    assert "helper process, shared memory" in stdout and "from disk" in stdout


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_small_run_from_redis(tmp_path: Path) -> None:
    result, stdout = _small_run(tmp_path, "--tier", "redis", "--switch-interval-ms", "0.5")
    assert result["tier"] == "redis" and result["switch_interval_ms"] == 0.5
    _check_arms(result, ["thread", "process"])
    assert "from a redis-server on loopback" in stdout


def test_a_fetch_that_misses_a_chunk_fails_the_run(tmp_path: Path) -> None:
    keys = [ChunkKey(bytes([i]) * KEY_BYTES) for i in range(2)]
    tier = FileTier(tmp_path, 1 << 30)
    tier.put(keys[0], torch.zeros((16, 16, 4096), dtype=torch.uint8))
    assert tier.flush(30)
    tier.close()
    url = f"file://{tmp_path}?size=1GiB"
    fetcher = fetch_step._ThreadFetcher(url, keys, (16, 16, 4096), set())
    try:
        fetcher.start()
        with pytest.raises(RuntimeError, match="returned 1 of 2 chunks"):
            while fetcher.done() is None:
                pass
    finally:
        fetcher.close()


def _row(p99: float, ratio: float, fetch: float | None) -> dict[str, object]:
    def s(x: float) -> dict[str, float]:
        return {"median": x, "min": x * 0.9, "max": x * 1.1}

    row: dict[str, object] = {"steps": 100, "step_p50_ms": s(1.2), "step_p99_ms": s(p99),
                              "step_p99_ratio": s(ratio)}  # fmt: skip
    if fetch is not None:
        row |= {"fetches": 40, "fetch_seen_ms": s(fetch), "fetch_own_ms": s(fetch * 0.8)}
    return row


def test_the_table_names_every_arm_and_its_figures(save_result: SaveResult) -> None:
    result = {
        "chunks": 32, "chunk_bytes": 3 << 20, "rounds": 8, "seconds": 3.0, "compute_ms": 1.0,
        "gap_ms": 20.0, "switch_interval_ms": 5.0, "cpus": {"step": [0], "fetch": [1]},
        "loads": [{"python_ms": 4.0, "arms": {
            "none": _row(4.35, 1.0, None), "thread-4": _row(9.85, 2.24, 11.7),
            "thread-1": _row(8.98, 2.06, 12.8), "process": _row(5.0, 1.16, 9.4),
        }}],
    }  # fmt: skip
    folder = save_result("fetch", result)
    text = fetch_step_report.render(folder)
    assert "`kvstack bench fetch --synthetic`" in text
    assert "| 4 ms | the step alone | 1.2 (1.08–1.32) | 4.35 (" in text
    assert "| helper process, shared memory |" in text and "1.16× (1.04–1.28)" in text
    assert "32 chunks of 3 MiB from the page cache" in text
    cold = folder / "fetch" / "fetch-cold-2026-12-02.json"
    results.save("fetch", ["--cold"], result | {"cold": True}, cold, quiet=True)
    both = fetch_step_report.render(folder)
    assert "32 chunks of 3 MiB from the page cache" in both
    assert "32 chunks of 3 MiB from disk" in both and "`kvstack bench fetch --cold`" in both
    ((what, figure, command),) = fetch_step_report.headline(folder)
    assert figure == (
        "11.7 ms on a loader thread (the connector's default), 9.4 ms in a helper process "
        "(opt-in `load_fetch: process`)"
    )
    assert "4 ms of Python" in what and command == "kvstack bench fetch --synthetic"
