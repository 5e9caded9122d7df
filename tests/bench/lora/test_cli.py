"""The adapter-cache benchmark runs end to end at a toy size (figures come from full runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstack.bench import results
from kvstack.bench.lora.arms import ARMS, arm_config
from kvstack.bench.lora.cli import run
from kvstack.bench.lora.des import DesTiming
from kvstack.bench.lora.des_mode import DesJob, run_des_jobs
from kvstack.bench.lora.seeds import BenchWorkload
from kvstack.bench.lora.setup import bench_config

# Small enough to run in seconds, tight enough (warm slots < adapters) that the arms differ.
TOY = ["--adapters", "120", "--engines", "2", "--gpu-slots", "4", "--host-slots", "16"]


def _check(arms: dict[str, dict[str, Any]]) -> None:
    assert set(arms) == {"weighted-lru", "lru-pins", "lru"}
    for arm in arms.values():
        invariants = arm["invariants"]
        assert invariants.get("pinned_eviction", 0) == 0
        assert invariants.get("wrong_version", 0) == invariants.get("unverified_load", 0) == 0
        assert invariants["wrong_version_seen_by_client"] == 0
        assert arm["requests_measured"] and arm["cold_loads"]


def test_discrete_event_arms_seeds_and_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lora.json"
    args = [*TOY, "--des-requests", "800", "--seeds", "1,2", "--zipf-s", "1.0,1.2"]
    assert run([*args, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "weighted-lru vs lru-pins:" in printed and "held-out seeds [1, 2]" in printed
    doc = results.load(out)
    assert doc.bench == "lora" and doc.command.startswith("kvstack bench lora --adapters 120")
    r = doc.result
    assert r["tuning"]["seed"] == 0 and r["tuning"]["zipf_s"] == 1.0
    assert r["tuning"]["weighted_defaults"]["qps_window_s"] == 1800.0
    runs = r["des"]["runs"]
    assert [(x["zipf_s"], x["seed"], x["role"]) for x in runs] == [
        (1.0, 0, "tuning"),
        (1.0, 1, "held-out"),
        (1.0, 2, "held-out"),
        (1.2, 1, "held-out"),
        (1.2, 2, "held-out"),
    ]
    for x in runs:
        _check(x["arms"])
        # The pins hold in both arms that have them, and only there.
        assert x["arms"]["weighted-lru"]["platinum_cold_starts"] == 0
        assert x["arms"]["lru-pins"]["platinum_cold_starts"] == 0
        assert set(x["pairs"]) == {
            "weighted-lru vs lru",
            "weighted-lru vs lru-pins",
            "lru-pins vs lru",
        }
    # Held-out seeds differ from each other and from the tuning seed.
    assert len({x["arms"]["lru"]["cold_loads"] for x in runs[:3]}) == 3
    summary = r["des"]["summary"]
    assert set(summary) == {"1", "1.2"} and summary["1"]["seeds"] == [1, 2]
    reduction = summary["1"]["pairs"]["weighted-lru vs lru"]["cold_loads_reduction"]
    values = [x["pairs"]["weighted-lru vs lru"]["cold_loads_reduction"] for x in runs[1:3]]
    assert reduction["values"] == values and reduction["min"] == min(values)


def test_processes_give_the_same_figures_as_one(tmp_path: Path) -> None:
    base = bench_config(tmp_path, tmp_path / "sources", tmp_path / "key.pub.pem")
    w = BenchWorkload(1, 1.0, "held-out")
    jobs = [
        DesJob(arm.name, arm_config(base, arm, 4, 16, {}), w, 120, 800, 12.0, 0.7, 2, 0.25,
               DesTiming(), 8)
        for arm in ARMS.values()
    ]  # fmt: skip

    def figures(processes: int) -> list[dict[str, Any]]:
        got = run_des_jobs(jobs, processes)
        return [{k: v for k, v in a.items() if k != "wall_s"} for a in got]

    assert figures(1) == figures(2)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--arms", "weighted-lru,fifo"], "choose from"),
        (["--policy-json", '{"never_evict_when": []}'], "weighted arm only"),
        (["--seeds", "0,1"], "tuning seed"),
    ],
)
def test_bad_flags_are_refused(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == 2
    assert why in capsys.readouterr().err


@pytest.mark.slow
def test_simulator_arms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    args = [
        "--mode", "sim", "--adapters", "60", "--requests", "240", "--engines", "2",
        "--rate", "8", "--time-scale", "2", "--rollout", "4",
        "--seeds", "none", "--json", str(out), "--workdir", str(tmp_path / "work"),
    ]  # fmt: skip
    assert run(args) == 0
    assert "simulated engines" in capsys.readouterr().out
    _check(results.load(out).result["sim"]["runs"][0]["arms"])
