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
    assert "match + insert" in text and "wall p50 < 1 ms" in text
    doc = json.loads(out.read_text())["result"]
    assert doc["tree_tokens"] >= 30000 and doc["rounds"] == 5
    for op in ("match", "insert", "match_insert", "copy_reference"):
        wall, cpu = doc[op]["wall"], doc[op]["cpu"]
        assert 0 < wall["p50_us"] <= wall["p99_us"] and 0 <= cpu["p50_us"] <= cpu["p99_us"], op
    assert 0 < doc["matched_tokens"] <= 2048
