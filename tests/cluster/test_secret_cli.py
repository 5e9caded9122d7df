"""``kvstack security``: ``PATH  fingerprint F`` by default, one JSON document with ``--json``,
the secret itself in neither."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstack.cluster.secret_cli import run


def test_init_secret_and_fingerprint_print_a_line_or_one_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cluster-secret"
    assert run("security", ["init-secret", str(path), "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["path"] == str(path) and len(created["fingerprint"]) == 8
    assert run("security", ["fingerprint", str(path)]) == 0
    line = capsys.readouterr().out
    assert line == f"{path}  fingerprint {created['fingerprint']}\n"
    assert run("security", ["fingerprint", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == created
    assert path.read_text().strip() not in line + json.dumps(created)
