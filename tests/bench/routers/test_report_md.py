"""The routers renderer on a small synthetic result written by ``results.save``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvstack.bench import results
from kvstack.bench.routers import report_md
from kvstack.bench.routers.cli import aggregate
from tests.bench.compare.test_compare import EXPERIMENT
from tests.bench.routers.test_routers import cell


@pytest.fixture(autouse=True)
def _no_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "machine_facts", lambda references=True: {"cores": 2})


def routers_result(arms: dict[str, Any], failed: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "variant": "shared-prefix",
        "config": "benchmarks/routers/shared-prefix.yaml",
        "workload": {"name": "shared-prefix", "params": {}},
        "repeats": 2,
        "seeds": [0, 1],
        "points": [8.0],
        "load": "rate",
        "duration_s": 20.0,
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "fleet": {"kind": "sim", "engines": 16, "kv_events": True, "time_scale": 0.5},
        "arms": arms,
        "failed": failed,
    }


def save(folder: Path, arms: dict[str, Any], failed: list[dict[str, Any]]) -> None:
    argv = ["--config", "benchmarks/routers/shared-prefix.yaml", "--repeats", "2"]
    path = folder / "routers" / "routers-shared-prefix-2026-12-01.json"
    results.save("routers", argv, routers_result(arms, failed), path=path, quiet=True)


def test_medians_spreads_ratios_and_an_arm_that_did_not_run(tmp_path: Path) -> None:
    assert report_md.headline(tmp_path) == []
    arms = aggregate(
        [
            [cell("x1", 60, 0.50), cell("x4 shared", 66, 0.55)],
            [cell("x1", 80, 0.60), cell("x4 shared", 72, 0.66), cell("x2", 70, 0.5)],
        ]
    )
    failed = [{"repeat": 1, "frontend": "x2", "point": 8.0, "error": "exited with code 1"}]
    save(tmp_path, arms, failed)
    text = report_md.render(tmp_path)
    assert text.startswith(
        "### shared-prefix — `kvstack bench routers --config "
        "benchmarks/routers/shared-prefix.yaml --repeats 2`"
    )
    assert "16 sim engines (time scale 0.5, KV events on)" in text
    assert "2 repeats (seeds 0, 1)" in text
    x4 = next(line for line in text.splitlines() if line.startswith("| x4 shared @ 8 |"))
    assert x4.startswith(
        "| x4 shared @ 8 | 6.9 (6.6–7.2) | 60.5% (55.0%–66.0%) | 1.10× (1.10×–1.10×) "
        "| 1.00× (0.90×–1.10×) |"
    )
    x2 = next(line for line in text.splitlines() if line.startswith("| x2 @ 8 |"))
    assert x2.endswith("| 1 |")  # one repeat of two
    assert "- x2 at 8, repeat 1: did not run: exited with code 1" in text
    ((what, figure, command),) = report_md.headline(tmp_path)
    assert what == "router replicas, shared-prefix: x4 shared @ 8 against one router"
    assert figure == "goodput 1.00× (0.90×–1.10×), prefix hits 1.10× (1.10×–1.10×) (medians of 2)"
    assert command.startswith("kvstack bench routers --config benchmarks/routers/shared-prefix")


def test_no_result_says_so(tmp_path: Path) -> None:
    assert "No committed result of `kvstack bench routers`" in report_md.render(tmp_path)


def test_bench_routers_writes_its_result_document(tmp_path: Path) -> None:
    """The real command on a tiny fleet (the round-robin proxy as its one arm) ends with the
    result document the renderer reads."""
    experiment = dict(EXPERIMENT, name="routers-tiny", rates=[4], duration_s=10,
                      frontends=EXPERIMENT["frontends"][:1])  # fmt: skip
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(experiment))
    out = tmp_path / "routers-tiny-2026-12-01.json"
    argv = ["--config", str(config), "--repeats", "2", "--output", str(tmp_path / "out")]
    done = subprocess.run(
        [sys.executable, "-m", "kvstack", "bench", "routers", *argv, "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = results.load(out)
    assert doc.bench == "routers" and doc.result["variant"] == "tiny"
    assert doc.result["repeats"] == 2 and doc.result["seeds"] == [0, 1]
    arm = doc.result["arms"]["round-robin @ 4"]
    assert arm["runs"] == 2 and len(arm["goodput"]["values"]) == 2
    assert arm["goodput_vs_single"]["values"] == [1.0, 1.0]
