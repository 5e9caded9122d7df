"""``kvstack bench epp`` runs end to end (a small smoke run) and its result renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("grpc")

from kvstack.bench.micro import epp, epp_report

pytestmark = [pytest.mark.slow]


def test_a_small_run_writes_a_result_the_report_renders(tmp_path: Path) -> None:
    # A plain <bench>-<day> name: without a variant the renderer reads only those.
    out = tmp_path / "epp" / "epp-2026-01-01.json"
    argv = ["--engines", "2", "--rates", "20", "--rounds", "1", "--round-s", "2",
            "--concurrency", "4", "--json", str(out)]  # fmt: skip
    assert epp.run(argv) in (0, 1)  # 1: the bar was missed, the figures are still written
    document = json.loads(out.read_text())
    assert document["bench"] == "epp" and document["command"] == "kvstack bench epp " + " ".join(
        argv
    )
    cell = document["result"]["latency"]["kvstack"]["20.0"]
    assert cell["achieved_rps"]["median"] > 0 and cell["errors"]["median"] == 0
    text = epp_report.render(tmp_path)
    assert "| 20 | kvstack |" in text and "| 20 | null |" in text
