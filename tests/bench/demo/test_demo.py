"""``kvstack demo`` as a user runs it, on simulated engines (the story CI checks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.stack.test_up import kvstack


@pytest.mark.slow
def test_demo_on_simulated_engines(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    demo = kvstack(
        "demo", "--engines", "sim", "--quick", "--duration", "4", "--out", str(out),
        "--no-progress", timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "multi-round-qa" in demo.stdout and "long-doc-qa" in demo.stdout
    assert (out / "demo.png").stat().st_size > 10_000
    rows = yaml.safe_load((out / "demo.json").read_text())
    assert {(r["workload"], r["mode"]) for r in rows} == {
        (w, m) for w in ("multi-round-qa", "long-doc-qa") for m in ("off", "on")
    }
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in rows)
