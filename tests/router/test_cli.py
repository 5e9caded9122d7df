"""``kvstack router``: flags, file and environment; refusing to start without backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.errors import ConfigError
from kvstack.router.cli import parse_args


def test_cli_flags_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("router:\n  port: 9000\n  policy: session\n  backends: [{url: 'http://f:1'}]\n")
    monkeypatch.setenv("KVSTACK_ROUTER_HEALTH__INTERVAL_S", "7")
    config, _ = parse_args(
        ["--config", str(path), "--backend", "http://a:1", "--backend", "http://b:2",
         "--model-alias", "gpt=toy", "--max-attempts", "2"]
    )  # fmt: skip
    assert config.port == 9000 and config.policy == "session"
    assert [b.url for b in config.backends] == ["http://a:1", "http://b:2"]
    assert config.model_aliases == {"gpt": "toy"} and config.retry.max_attempts == 2
    assert config.health.interval_s == 7
    with pytest.raises(ConfigError, match="ALIAS=MODEL"):
        parse_args(["--model-alias", "gpt"])
    k8s, _ = parse_args(
        ["--discovery", "kubernetes", "--k8s-selector", "app=x", "--k8s-port", "81"]
    )
    assert k8s.discovery.kind == "kubernetes" and k8s.discovery.kubernetes.port == 81


def test_cli_refuses_to_start_without_backends(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstack.router.cli import run

    assert run("router", []) == 2
    assert "no backends" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse reports bad choices itself
        run("router", ["--policy", "nope"])
    assert exit_info.value.code == 2
    assert run("router", ["--backend", "ftp://x"]) == 2
    assert "must look like http://host:port" in capsys.readouterr().err
