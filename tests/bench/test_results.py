"""Result files: the envelope every ``kvstack bench`` command writes, and its reading back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstack.bench import report, results


def test_save_writes_the_command_commit_machine_and_figures(tmp_path: Path) -> None:
    out = results.save("kv", ["--quick"], {"store_gbps": 1.5}, tmp_path / "kv.json", quiet=True)
    doc = json.loads(out.read_text())
    assert doc["bench"] == "kv" and doc["command"] == "kvstack bench kv --quick"
    assert doc["result"] == {"store_gbps": 1.5}
    machine = doc["machine"]
    assert machine["cores"] >= 1 and machine["memcpy_gbps"] > 0 and machine["loopback_gbps"] > 0
    assert doc["commit"] and doc["measured"].endswith("Z")
    r = results.load(out)
    assert r.result == {"store_gbps": 1.5} and r.provenance == "measured" and r.stale is None


def test_default_path_is_under_bench_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = results.save("radix", [], {"p99_ms": 1.0}, quiet=True)
    assert out.parent == Path("bench-results/radix") and out.name.startswith("radix-")


def test_flat_documents_keep_their_keys_and_refuse_clashes(tmp_path: Path) -> None:
    body = {"story": {"cold_ttft_s": 9.0}, "load": []}
    out = results.save("demo", [], body, tmp_path / "demo.json", prog=["kvstack", "demo"],
                       quiet=True, flat=True)  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["story"] == {"cold_ttft_s": 9.0} and doc["command"] == "kvstack demo"
    assert results.load(out).result == body
    with pytest.raises(ValueError, match="clash"):
        results.save("demo", [], {"commit": 1}, tmp_path / "x.json", quiet=True, flat=True)


def test_newest_picks_by_measured_time_and_variant(tmp_path: Path) -> None:
    folder = tmp_path / "compare"
    folder.mkdir()
    files = (("compare-unique-a.json", "2026-11-01"), ("compare-unique-b.json", "2026-12-01"),
             ("compare-hot-prefix-c.json", "2026-12-02"))  # fmt: skip
    for name, day in files:
        doc = {"bench": "compare", "command": "kvstack bench", "commit": "abc1234",
               "measured": f"{day}T00:00:00Z", "result": {"day": day}}  # fmt: skip
        (folder / name).write_text(json.dumps(doc))
    assert results.newest(tmp_path, "compare", "unique").result["day"] == "2026-12-01"
    assert results.newest(tmp_path, "compare") is None  # only variant files there
    (folder / "compare-2026-10-01.json").write_text((folder / "compare-unique-a.json").read_text())
    assert results.newest(tmp_path, "compare").result["day"] == "2026-11-01"
    assert results.newest(tmp_path, "kv") is None


def test_a_document_without_the_envelope_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"store_gbps": 1.0}))
    with pytest.raises(ValueError, match="not a kvstack bench result"):
        results.load(bad)


def test_target_cells_say_met_or_missed() -> None:
    assert report.target(True, "≥ 0.8×") == "≥ 0.8×: met"
    assert report.target(False, "≥ 0.8×") == "≥ 0.8×: **missed**"
    assert (
        report.num(5076.2) == "5,076"
        and report.num(47.04) == "47.0"
        and report.num(3.164) == "3.16"
    )
