"""Fixtures for the micro benchmarks' tests: result files written without measuring the host."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvstack.bench import results

SaveResult = Callable[[str, dict[str, Any]], Path]


@pytest.fixture
def save_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SaveResult:
    """``save_result(bench, result)`` writes ``tmp_path/<bench>/<bench>-2026-12-01.json`` with
    :func:`kvstack.bench.results.save` (fixed machine facts instead of a second of memcpy and
    loopback measurements) and returns the results folder."""
    facts = {"cpu_model": "Test CPU", "cores": 2, "memcpy_gbps": 2.0, "loopback_gbps": 1.0}
    monkeypatch.setattr(results, "machine_facts", lambda: dict(facts))
    monkeypatch.setenv("KVSTACK_COMMIT", "abc1234")

    def save(bench: str, result: dict[str, Any]) -> Path:
        path = tmp_path / bench / f"{bench}-2026-12-01.json"
        results.save(bench, ["--synthetic"], result, path, quiet=True)
        return tmp_path

    return save
