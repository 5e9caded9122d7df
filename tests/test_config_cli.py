"""``kvstack config show | reference``: YAML and a markdown table by default, ``--json`` for
scripts (one JSON document on stdout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvstack.config_cli import run


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "kvstack.yaml"
    path.write_text("router:\n  port: 18999\nkv:\n  tiers: ['cpu://?size=1MiB']\n")
    monkeypatch.delenv("KVSTACK_CONFIG", raising=False)
    return path


def test_show_prints_yaml_by_default_and_json_with_the_flag(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("config", ["show", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "  port: 18999\n" in text and not text.lstrip().startswith("{")
    as_yaml = yaml.safe_load(text)
    assert run("config", ["show", "--config", str(config), "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json == as_yaml  # the same tree either way
    assert as_json["router"]["port"] == 18999 and as_json["kv"]["tiers"] == ["cpu://?size=1MiB"]


def test_reference_prints_markdown_by_default_and_json_rows_with_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run("config", ["reference"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| key | type | default | description |")
    assert run("config", ["reference", "--json"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)["keys"]}
    assert rows["router.port"]["type"] == "int" and not rows["router.port"]["required"]
    assert f"| `router.port` | int | `{rows['router.port']['default']}` |" in table
    assert len(rows) == table.count("\n| `")


def test_reference_of_the_connector_lists_its_keys_and_none_of_the_sections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run("config", ["reference", "--connector", "--json"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)["keys"]}
    assert rows["staging_mib"]["default"] == 2048 and rows["load_mode"]["default"] == "auto"
    assert not any(key.startswith(("router.", "kv.")) for key in rows)
