"""``kvstack bench radix`` runs end to end on a small tree and reports every operation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstack.bench.micro.radix import run


def test_bench_radix_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "radix.json"
    args = ["--tree-tokens", "30000", "--prompt-tokens", "2048", "--rounds", "5"]
    assert run([*args, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "match + insert" in text and "1 ms bar" in text
    doc = json.loads(out.read_text())
    assert doc["tree_tokens"] >= 30000 and doc["match"]["p50_us"] > 0
    assert 0 < doc["matched_tokens"] <= 2048
