"""``kvstack router``: flags, file and environment; refusing to start without backends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


def test_production_stack_flags_are_aliases(caplog: pytest.LogCaptureFixture) -> None:
    argv = [
        "--service-discovery", "static",
        "--static-backends", "http://a:8000,http://b:8000",
        "--static-models", "llama,qwen",
        "--static-aliases", "gpt-4o:llama",
        "--routing-logic", "prefixaware",
        "--session-key", "X-User-Id",
        "--engine-stats-interval", "15",
        "--max-instance-failover-reroute-attempts", "2",
        "--request-stats-window", "60",
        "--log-stats",
    ]  # fmt: skip
    config, _ = parse_args(argv)
    assert [(b.url, b.models) for b in config.backends] == [
        ("http://a:8000", ["llama"]),
        ("http://b:8000", ["qwen"]),
    ]
    assert (config.policy, config.session_header) == ("prefix", "x-user-id")
    assert config.model_aliases == {"gpt-4o": "llama"}
    assert (config.scrape.interval_s, config.retry.max_attempts) == (15, 3)
    assert "--request-stats-window is ignored" in caplog.text
    for logic, policy in [("roundrobin", "round_robin"), ("session", "session"),
                          ("kvaware", "ttft")]:  # fmt: skip
        config, _ = parse_args(["--static-backends", "http://a:1", "--routing-logic", logic])
        assert config.policy == policy
    k8s, _ = parse_args(
        ["--service-discovery", "k8s", "--k8s-label-selector", "model=llama",
         "--k8s-namespace", "llm", "--k8s-port", "8000"]
    )  # fmt: skip
    assert k8s.discovery.kind == "kubernetes"
    kube = k8s.discovery.kubernetes
    assert (kube.label_selector, kube.namespace, kube.port) == ("model=llama", "llm", 8000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--static-backends", "http://a:1,http://b:1", "--static-models", "m"], "one per backend"),
        (["--static-models", "m"], "needs --static-backends"),
        (["--routing-logic", "disaggregated_prefill"], "router.pd.models"),
        (["--dynamic-config-json", "c.json"], "--dynamic-config-json has no kvstack equivalent"),
        (["--lmcache-controller-port", "9000"], "--index-url"),
        (["--routing-logic", "session", "--policy", "prefix"], "contradicts --policy"),
        (["--service-discovery", "k8s", "--discovery", "static"], "contradicts --discovery"),
    ],
)
def test_production_stack_flags_without_an_equivalent_say_why(
    argv: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


def test_ready_is_logged_only_once_the_port_is_bound() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        argv = [sys.executable, "-m", "kvstack", "router", "--host", "127.0.0.1", "--port", port]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTACK_")}
        result = subprocess.run(
            [*argv, "--backend", "http://127.0.0.1:9"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert result.returncode != 0
    assert "address already in use" in result.stderr.lower()
    assert "router ready" not in result.stderr
