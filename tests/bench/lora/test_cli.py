"""The adapter-cache benchmark runs end to end at a toy size (figures come from full runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstack.bench.lora.cli import run


def _check(arms: dict[str, dict[str, object]]) -> None:
    assert set(arms) == {"weighted-lru", "lru"}
    for arm in arms.values():
        invariants = arm["invariants"]
        assert isinstance(invariants, dict)
        assert invariants.get("pinned_eviction", 0) == 0
        assert invariants.get("wrong_version", 0) == invariants.get("unverified_load", 0) == 0
        assert invariants["wrong_version_seen_by_client"] == 0
        assert arm["requests_measured"] and arm["cold_loads"]


def test_discrete_event_arms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    args = [
        "--mode",
        "des",
        "--adapters",
        "100",
        "--des-requests",
        "3000",
        "--engines",
        "2",
        "--out",
        str(out),
    ]
    assert run(args) == 0
    assert "weighted vs LRU: cold loads" in capsys.readouterr().out
    report = json.loads(out.read_text())["des"]
    _check(report["arms"])
    assert report["arms"]["weighted-lru"]["platinum_cold_starts"] == 0


@pytest.mark.slow
def test_simulator_arms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    args = [
        "--mode",
        "sim",
        "--adapters",
        "60",
        "--requests",
        "240",
        "--engines",
        "2",
        "--rate",
        "8",
        "--time-scale",
        "2",
        "--rollout",
        "4",
        "--out",
        str(out),
        "--workdir",
        str(tmp_path / "work"),
    ]
    assert run(args) == 0
    assert "simulated engines" in capsys.readouterr().out
    _check(json.loads(out.read_text())["sim"]["arms"])
