"""The ``kvstack`` command: usage, dispatch, exit codes; heavy packages load only when used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvstack import __version__
from kvstack.cli import COMMANDS, main


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_no_arguments_and_unknown_commands_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == __version__


def test_config_show_prints_the_effective_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kv:\n  model: shown@1\n")
    monkeypatch.setenv("KVSTACK_KV_CHUNK_SIZE", "128")
    assert main(["config", "show", "--config", str(path), "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["kv"]["model"] == "shown@1" and tree["kv"]["chunk_size"] == 128


def test_config_reference_is_a_markdown_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| key | type | default | description |")
    assert "| `kv.chunk_size` | int | `256` |" in out
    assert "`kv.model_shape.num_layers`" in out


def test_bench_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--help"]) == 0
    assert "kv " in capsys.readouterr().out
    assert main(["bench", "nope"]) == 2


def test_console_script_and_lazy_imports() -> None:
    code = (
        "import sys; from kvstack.cli import main; rc = main(['--help']); "
        "assert 'torch' not in sys.modules, 'kvstack --help imported torch'; sys.exit(rc)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    out = subprocess.run(
        [sys.executable, "-m", "kvstack", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == __version__
